#!/usr/bin/env bash
# Validates the Kubernetes and observability files without a cluster (docs/kubernetes.md,
# docs/observability.md):
#   chart     deploy/helm/embatch: `helm lint`, and `helm template` of values.yaml, values-gpu.yaml
#             and each ci/*-values.yaml, for Kubernetes 1.30 and 1.37, validated by kubeconform
#             -strict against the schemas in deploy/schemas/ (Kubernetes, KEDA, Prometheus
#             Operator; nothing skipped); renders that must fail do, with the chart's message;
#             every env var the containers get is a setting of docs/configuration.md, and the
#             values' settings carry its defaults (scripts/checks/deploy.py env).
#   rules     deploy/prometheus/embatch-rules.yaml: promtool check rules and test rules;
#             compose's Prometheus config (deploy/prometheus/compose-prometheus.yml, which loads
#             those rules): promtool check config.
#   metrics   the dashboard (deploy/grafana/embatch.json) and the rules name only metrics the
#             source exports; the chart's copies are identical (scripts/checks/deploy.py metrics).
#   keda      the ScaledObjects' Prometheus queries give the replicas expected on synthetic
#             series (deploy/prometheus/keda-queries.test.yaml).
# The NATS subchart is not fetched (no network in CI): the chart is rendered from a copy whose
# Chart.yaml lists no dependency, nats.enabled as in each values file, which renders every
# embatch resource and the in-chart NATS' addresses but not the NATS StatefulSet. After
# `helm dependency update deploy/helm/embatch` (charts/nats-*.tgz present) the real chart is also
# rendered and validated.
# Installs helm, kubeconform and promtool into .bin when missing (scripts/install-deploy-tools.sh).
# Env: DEPLOY_CHECK_SKIP (comma-separated: chart,rules,metrics,keda).
# Ends with "deploy-check: N passed, M failed", non-zero on a failure. Leaves nothing in the repo.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chart_src=$root/deploy/helm/embatch
schemas=$root/deploy/schemas
check_py=(python3 "$root/scripts/checks/deploy.py")
kube_versions=(1.30.0 1.37.0)
passed=0 failed=0
enabled() { [[ ,${DEPLOY_CHECK_SKIP:-}, != *",$1,"* ]]; }
fail() { echo "FAIL  $*" >&2; failed=$((failed + 1)); }
ok() { echo "ok    $*"; passed=$((passed + 1)); }

# run NAME CMD...: runs a check program printing "ok MSG", "info MSG" or "fail MSG" per line and
# counts them; any other line is a failure, as is a non-zero exit without a "fail" line.
run() {
  local name=$1 line status=0 out
  shift
  out=$("$@" 2>&1) || status=$?
  while IFS= read -r line; do
    case $line in
      ok\ *) ok "${line#ok }" ;;
      info\ *) echo "      ${line#info }" ;;
      "") ;;
      *) fail "${line#fail }" ;;
    esac
  done <<<"$out"
  if ((status != 0)) && ! grep -q '^fail ' <<<"$out"; then fail "$name: exited with status $status"; fi
}

# try NAME CMD...: ok when CMD succeeds; else its output and a failure.
try() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    ok "$name"
  else
    fail "$name"
    # shellcheck disable=SC2001 # indents every line
    sed 's/^/      /' <<<"$out" >&2
  fi
}

start=$SECONDS
bin=$("$root/scripts/install-deploy-tools.sh")
helm=$bin/helm kubeconform=$bin/kubeconform promtool=$bin/promtool
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "tools: helm $(go version -m "$helm" 2>/dev/null | awk '$1 == "mod" { print $3 }'), kubeconform $(go version -m "$kubeconform" 2>/dev/null | awk '$1 == "mod" { print $3 }'), $("$promtool" --version 2>&1 | head -1) (ready after $((SECONDS - start)) s)"

kubeconform_args=(-strict -summary
  -schema-location "$schemas/kubernetes/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
  -schema-location "$schemas/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json")

# validate NAME CHART [HELM ARGS...]: lint, then render for each Kubernetes version and validate.
validate() {
  local name=$1 chart=$2 version out
  shift 2
  try "helm lint ($name)" "$helm" lint "$chart" --strict --kube-version "${kube_versions[0]}" "$@"
  for version in "${kube_versions[@]}"; do
    out=$work/render-${name//[^a-zA-Z0-9]/_}-$version.yaml
    if ! "$helm" template embatch "$chart" --namespace prod --kube-version "$version" "$@" >"$out" 2>"$out.err"; then
      fail "helm template ($name, Kubernetes $version)"
      sed 's/^/      /' "$out.err" >&2
      continue
    fi
    try "kubeconform -strict ($name, Kubernetes $version): $(grep -c '^kind: ' "$out") resources" \
      "$kubeconform" "${kubeconform_args[@]}" -kubernetes-version "$version" "$out"
  done
}

# refuses NAME MESSAGE_RE VALUES_YAML: a render with these values fails, naming MESSAGE_RE.
refuses() {
  local name=$1 pattern=$2 values=$work/refused.yaml
  printf '%s\n' "$3" >"$values"
  if "$helm" template embatch "$chart" --kube-version "${kube_versions[0]}" -f "$values" >/dev/null 2>"$work/refused.err"; then
    fail "refuses $name: the render succeeded"
  else
    run "refuses $name" "${check_py[@]}" fails "$pattern" <"$work/refused.err"
  fi
}

# A copy of the chart without the nats dependency (its package is fetched only by
# `helm dependency update`), for every render below.
chart=$work/embatch
cp -r "$chart_src" "$chart"
rm -rf "$chart/charts"
python3 - "$chart/Chart.yaml" <<'EOF'
import sys, yaml
path = sys.argv[1]
meta = yaml.safe_load(open(path))
assert [d["name"] for d in meta.pop("dependencies")] == ["nats"], "the chart's dependencies changed"
yaml.safe_dump(meta, open(path, "w"), sort_keys=False)
EOF

if enabled chart; then
  printf '\n== chart: %s\n' "${chart_src#"$root"/}"
  validate "values.yaml" "$chart"
  validate "values-gpu.yaml" "$chart" -f "$chart/values-gpu.yaml"
  for values in "$chart"/ci/*-values.yaml; do
    validate "ci/${values##*/}" "$chart" -f "$values"
  done
  run "env" "${check_py[@]}" env "$work"/render-*-"${kube_versions[0]}".yaml

  refuses "a worker without replicas" "minReplicaCount is 0: at least 1" \
    'keda: {enabled: true, prometheus: {serverAddress: http://prometheus:9090}}
workers: [{name: minilm, keda: {minReplicaCount: 0}}]'
  refuses "an unknown upstream" 'upstream "gpu": one of local, tei, external' \
    'workers: [{name: minilm, upstream: gpu}]'
  refuses "an external upstream without its URL" "upstream external needs external.url" \
    'workers: [{name: hosted, upstream: external}]'
  refuses "a worker name that cannot name a Deployment" "must be lowercase letters" \
    'workers: [{name: MiniLM}]'
  refuses "an external NATS without its URL" "natsClient.url is required" \
    'nats: {enabled: false}'
  refuses "KEDA against an external NATS without its monitoring endpoint" "keda.bulk.natsMonitoringEndpoint is required" \
    'nats: {enabled: false}
natsClient: {url: "nats://nats.example:4222"}
keda: {enabled: true, prometheus: {enabled: false}}'
  refuses "KEDA without a Prometheus" "keda.prometheus.serverAddress is required" \
    'keda: {enabled: true}'
  refuses "a NATS token auth without the token" "natsClient.auth.token is required" \
    'natsClient: {auth: {type: token}}'
  refuses "a JetStream replica count out of range" "natsClient.jetstreamReplicas \"7\": auto or 1 to 5" \
    'natsClient: {jetstreamReplicas: 7}'

  shopt -s nullglob
  deps=("$chart_src"/charts/nats-*.tgz)
  shopt -u nullglob
  if ((${#deps[@]})); then
    validate "with the nats subchart, values.yaml" "$chart_src"
    validate "with the nats subchart, values-gpu.yaml" "$chart_src" -f "$chart_src/values-gpu.yaml"
  else
    echo "      the nats subchart is not in charts/ (helm dependency update fetches it): its StatefulSet is not rendered"
  fi
fi

if enabled rules; then
  printf '\n== rules: deploy/prometheus\n'
  try "promtool check rules embatch-rules.yaml" "$promtool" check rules "$root/deploy/prometheus/embatch-rules.yaml"
  # shellcheck disable=SC2016 # expanded by the inner shell
  try "promtool test rules embatch-rules.test.yaml" bash -c 'cd "$1" && "$2" test rules embatch-rules.test.yaml' _ "$root/deploy/prometheus" "$promtool"
  try "promtool check config compose-prometheus.yml (with its rules)" "$promtool" check config "$root/deploy/prometheus/compose-prometheus.yml"
fi

if enabled metrics; then
  printf '\n== metrics: dashboard and rules against the source\n'
  run "metrics" "${check_py[@]}" metrics "$promtool"
fi

if enabled keda; then
  printf '\n== keda: the ScaledObjects'"'"' Prometheus queries\n'
  keda_render=$work/keda.yaml
  if "$helm" template embatch "$chart" --namespace prod --kube-version "${kube_versions[0]}" -f "$chart/values-gpu.yaml" >"$keda_render" 2>"$work/keda.err"; then
    run "keda" "${check_py[@]}" keda "$promtool" "$keda_render" "$root/deploy/prometheus/keda-queries.test.yaml"
  else
    fail "helm template for the KEDA queries"
    sed 's/^/      /' "$work/keda.err" >&2
  fi
fi

echo
echo "deploy-check took $((SECONDS - start)) s"
echo "deploy-check: $passed passed, $failed failed"
((failed == 0))
