{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "embatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "embatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "embatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "embatch.labels" -}}
helm.sh/chart: {{ include "embatch.chart" . }}
{{ include "embatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: embatch
{{- end }}

{{- define "embatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "embatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "embatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "<registry>/<repository>:<tag>" of an embatch image; arg: (list $ "gateway") */}}
{{- define "embatch.image" -}}
{{- $root := index . 0 }}
{{- $repo := get $root.Values.image (index . 1) }}
{{- $tag := default $root.Chart.AppVersion $root.Values.image.tag }}
{{- if $root.Values.image.registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) $repo $tag }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/* NATS ----------------------------------------------------------------------------------- */}}

{{/* The in-chart NATS' full name, as the nats chart computes it (nats.fullname). */}}
{{- define "embatch.natsFullname" -}}
{{- $nats := .Values.nats | default dict }}
{{- if $nats.fullnameOverride }}
{{- $nats.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "nats" $nats.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "embatch.natsNamespace" -}}
{{- default .Release.Namespace (.Values.nats | default dict).namespaceOverride }}
{{- end }}

{{/* NATS_URL: natsClient.url, else the in-chart server. */}}
{{- define "embatch.natsUrl" -}}
{{- if .Values.natsClient.url }}
{{- .Values.natsClient.url }}
{{- else if .Values.nats.enabled }}
{{- $scheme := ternary "tls" "nats" .Values.natsClient.tls.enabled }}
{{- printf "%s://%s.%s.svc.%s:4222" $scheme (include "embatch.natsFullname" .) (include "embatch.natsNamespace" .) .Values.clusterDomain }}
{{- else }}
{{- fail "natsClient.url is required when nats.enabled is false (the external NATS server's URL)" }}
{{- end }}
{{- end }}

{{/* host:port of NATS' monitoring endpoint for KEDA: the value, else the in-chart headless
service (KEDA asks a cluster's consumer leader at <server name>.<this host>, and the nats chart's
server names are its pod names). */}}
{{- define "embatch.natsMonitoringEndpoint" -}}
{{- if .Values.keda.bulk.natsMonitoringEndpoint }}
{{- .Values.keda.bulk.natsMonitoringEndpoint }}
{{- else if .Values.nats.enabled }}
{{- printf "%s-headless.%s.svc.%s:8222" (include "embatch.natsFullname" .) (include "embatch.natsNamespace" .) .Values.clusterDomain }}
{{- else }}
{{- fail "keda.bulk.natsMonitoringEndpoint is required with an external NATS (host:port of its monitoring port)" }}
{{- end }}
{{- end }}

{{- define "embatch.natsAuthSecret" -}}
{{- default (printf "%s-nats-auth" (include "embatch.fullname" .)) .Values.natsClient.auth.existingSecret }}
{{- end }}

{{- define "embatch.natsTlsSecret" -}}
{{- default (printf "%s-nats-tls" (include "embatch.fullname" .)) .Values.natsClient.tls.existingSecret }}
{{- end }}

{{/* JETSTREAM_REPLICAS: natsClient.jetstreamReplicas, "auto" or 1 to 5. */}}
{{- define "embatch.jetstreamReplicas" -}}
{{- $r := toString (default "auto" .Values.natsClient.jetstreamReplicas) }}
{{- if not (has $r (list "auto" "1" "2" "3" "4" "5")) }}
{{- fail (printf "natsClient.jetstreamReplicas %q: auto or 1 to 5" $r) }}
{{- end }}
{{- $r }}
{{- end }}

{{/* Env entries for the NATS connection: URL, credentials, TLS, JetStream replicas (README "NATS
connection"). */}}
{{- define "embatch.natsEnv" -}}
- name: NATS_URL
  value: {{ include "embatch.natsUrl" . | quote }}
- name: JETSTREAM_REPLICAS
  value: {{ include "embatch.jetstreamReplicas" . | quote }}
{{- $auth := .Values.natsClient.auth }}
{{- $secret := include "embatch.natsAuthSecret" . }}
{{- if eq $auth.type "userPassword" }}
- name: NATS_USER
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: user}}
- name: NATS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: password}}
{{- else if eq $auth.type "token" }}
- name: NATS_TOKEN
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: token}}
{{- else if eq $auth.type "nkey" }}
- name: NATS_NKEY
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: nkey}}
{{- else if eq $auth.type "creds" }}
- name: NATS_CREDS
  value: /etc/embatch/nats-auth/creds
{{- else if ne $auth.type "none" }}
{{- fail (printf "natsClient.auth.type %q: one of none, userPassword, token, nkey, creds" $auth.type) }}
{{- end }}
{{- if .Values.natsClient.tls.enabled }}
- name: NATS_TLS_CA
  value: /etc/embatch/nats-tls/ca.crt
{{- if .Values.natsClient.tls.mutual }}
- name: NATS_TLS_CERT
  value: /etc/embatch/nats-tls/tls.crt
- name: NATS_TLS_KEY
  value: /etc/embatch/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{- define "embatch.natsVolumeMounts" -}}
{{- if eq .Values.natsClient.auth.type "creds" }}
- name: nats-auth
  mountPath: /etc/embatch/nats-auth
  readOnly: true
{{- end }}
{{- if .Values.natsClient.tls.enabled }}
- name: nats-tls
  mountPath: /etc/embatch/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "embatch.natsVolumes" -}}
{{- if eq .Values.natsClient.auth.type "creds" }}
- name: nats-auth
  secret:
    secretName: {{ include "embatch.natsAuthSecret" . }}
    items: [{key: creds, path: creds}]
{{- end }}
{{- if .Values.natsClient.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ include "embatch.natsTlsSecret" . }}
{{- end }}
{{- end }}

{{/* Settings ------------------------------------------------------------------------------- */}}

{{/* EMBATCH_DEFAULT_MODEL: defaultModel, else the first worker's model. */}}
{{- define "embatch.defaultModel" -}}
{{- if .Values.defaultModel }}
{{- .Values.defaultModel }}
{{- else if .Values.workers }}
{{- $first := first .Values.workers }}
{{- default $first.name $first.model }}
{{- end }}
{{- end }}

{{/* Env entries from a map of settings, sorted by name; arg: a dict. */}}
{{- define "embatch.envMap" -}}
{{- range $name, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Workers -------------------------------------------------------------------------------- */}}

{{/* One worker entry merged over workerDefaults, as YAML; arg: (list $ $entry). */}}
{{- define "embatch.worker" -}}
{{- $root := index . 0 }}
{{- $entry := index . 1 }}
{{- $w := mergeOverwrite (deepCopy $root.Values.workerDefaults) (deepCopy $entry) }}
{{- if not $w.name }}{{ fail "every entry of workers needs a name" }}{{ end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $w.name) }}
{{- fail (printf "workers: name %q must be lowercase letters, digits and '-' (it names a Deployment)" $w.name) }}
{{- end }}
{{- $_ := set $w "model" (default $w.name $w.model) }}
{{- $_ := set $w "upstream" (default "local" $w.upstream) }}
{{- if not (has $w.upstream (list "local" "tei" "external")) }}
{{- fail (printf "workers[%s].upstream %q: one of local, tei, external" $w.name $w.upstream) }}
{{- end }}
{{- if and (eq $w.upstream "external") (not $w.external.url) }}
{{- fail (printf "workers[%s]: upstream external needs external.url (TEI_URL)" $w.name) }}
{{- end }}
{{- $min := int $w.keda.minReplicaCount }}
{{- if lt $min 1 }}
{{- fail (printf "workers[%s].keda.minReplicaCount is %d: at least 1, the interactive lane never scales to zero" $w.name $min) }}
{{- end }}
{{- toYaml $w }}
{{- end }}

{{/* The durable bulk consumer of a model: bulk-items-<model>, every byte other than an ASCII
letter, digit or '-' written _XX (protocol/src/bulk.rs, items_consumer); arg: the model name. */}}
{{- define "embatch.bulkConsumer" -}}
{{- $out := "bulk-items-" }}
{{- range $char := splitList "" . }}
{{- if regexMatch "^[A-Za-z0-9-]$" $char }}
{{- $out = printf "%s%s" $out $char }}
{{- else }}
{{- $out = printf "%s_%s" $out (printf "% X" $char | replace " " "_") }}
{{- end }}
{{- end }}
{{- $out }}
{{- end }}

{{/* A PromQL label matcher list for a model, with keda.prometheus.extraSelector; arg: (list $ model). */}}
{{- define "embatch.promSelector" -}}
{{- $root := index . 0 }}
{{- $model := index . 1 | replace "\\" "\\\\" | replace "\"" "\\\"" }}
{{- $extra := tpl $root.Values.keda.prometheus.extraSelector $root }}
{{- if $extra }}
{{- printf "{model=\"%s\",%s}" $model $extra }}
{{- else }}
{{- printf "{model=\"%s\"}" $model }}
{{- end }}
{{- end }}

{{- define "embatch.teiApiKeySecret" -}}
{{- default (printf "%s-tei-api-key" (include "embatch.fullname" .)) .Values.teiApiKey.existingSecret }}
{{- end }}

{{- define "embatch.hfTokenSecret" -}}
{{- default (printf "%s-hf-token" (include "embatch.fullname" .)) .Values.hfToken.existingSecret }}
{{- end }}

{{/* The pod annotations that roll pods when a Secret the chart creates changes. */}}
{{- define "embatch.checksums" -}}
checksum/secrets: {{ include (print .Template.BasePath "/secrets.yaml") . | sha256sum }}
{{- end }}
