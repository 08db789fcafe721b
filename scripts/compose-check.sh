#!/usr/bin/env bash
# Validates the deployment files without a Docker engine:
#
#   1. compose  `docker compose config` accepts compose.yaml for every supported profile set (none,
#               gpu, cpu, local, gpu+local, cpu+local), once with .env.example, once with .env if
#               there is one, and once with no env file at all (compose.yaml's own defaults); each
#               profile set enables exactly the expected services, and, as rendered with each env
#               file, the services are wired as intended (scalable workers, health checks,
#               depends_on, GPU reservation, grace periods vs timeouts, TEI batch cap, ...).
#               An env file's own COMPOSE_PROFILES, if set, is checked too.
#   2. env      .env.example and compose.yaml name the same variables, with the same defaults.
#   3. flags    every environment variable compose sets on gateway / worker / worker-local is a flag
#               of the matching binary: its `--help` shows `[env: NAME=`. RUST_LOG is the only
#               exception (tracing's filter, not a flag).
#   4. nats     nats/nats.conf and nats/cluster/*.conf pass `nats-server -t`; each one starts with
#               the expected max_payload, and n1..n3 form a cluster with every port overridden on
#               the command line (as a test harness would).
#   5. docker   the Dockerfile parses and converts to a build graph for every target (BuildKit's own
#               frontend, linter on, base images must have explicit tags), and .dockerignore keeps
#               the sources in the build context and target/, .git, models/, .env out.
#
# Tools it fetches when missing (Go module proxy only):
#   - the Compose v2 CLI plugin (go install github.com/docker/compose/v2/cmd@v2.29.7, a few minutes;
#     installed as ${DOCKER_CONFIG:-~/.docker}/cli-plugins/docker-compose),
#   - nats-server v2.10.22 (go install, into $(go env GOPATH)/bin),
#   - BuildKit v0.16.0 for a small Dockerfile checker compiled into ~/.cache/embatch-compose-check.
#
# Environment:
#   EMBATCH_GATEWAY_BIN, EMBATCH_WORKER_BIN  binaries whose --help is checked (both or neither).
#       Default: the newer of target/release and target/debug holding both (as built: stale
#       binaries are not rebuilt); else `cargo build -p embatch-gateway -p embatch-worker` and
#       target/debug. CARGO_TARGET_DIR is honoured.
#   NATS_SERVER          nats-server to use (default: PATH, then $(go env GOPATH)/bin).
#   COMPOSE_CHECK_SKIP   comma-separated checks to skip: compose, env, flags, nats, docker.
#
# Prints one line per check and closes with "compose-check: N passed, M failed"; exits non-zero
# when anything failed. Leaves nothing behind in the repository.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

COMPOSE_VERSION=v2.29.7
NATS_SERVER_VERSION=v2.10.22
BUILDKIT_VERSION=v0.16.0
EXPECTED_MAX_PAYLOAD=8388608 # 8 MiB, see nats/nats.conf

passed=0
failed=0
pass() { echo "ok    $*"; passed=$((passed + 1)); }
fail() { echo "FAIL  $*" >&2; failed=$((failed + 1)); }
step() { printf '\n== %s\n' "$*"; }
die() { echo "compose-check: $*" >&2; exit 1; }

skip=",${COMPOSE_CHECK_SKIP:-},"
enabled() { [[ $skip != *",$1,"* ]]; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# report CMD...: runs a checker printing "ok MSG", "info MSG" or anything else (= a failure) per
# line, and counts them; a checker that crashes or exits non-zero without saying why fails too.
report() {
  local line status=0 out
  out=$("$@" 2>&1) || status=$?
  while IFS= read -r line; do
    case $line in
      ok\ *) pass "${line#ok }" ;;
      info\ *) echo "      ${line#info }" ;;
      fail\ *) fail "${line#fail }" ;;
      "") ;;
      *) fail "$line" ;;
    esac
  done <<<"$out"
  if ((status != 0)) && ! grep -q '^fail ' <<<"$out"; then
    fail "$1 exited with status $status"
  fi
}

# Compose with a clean environment, so that variables exported in the caller's shell don't leak
# into the interpolation: only the env file given decides. COMPOSE_PROFILES is set empty so that
# only --profile flags select profiles, even when the env file sets COMPOSE_PROFILES (compose
# prefers the process environment over the env file); compose_with_env_profiles doesn't do that.
compose_cmd=()
compose() {
  env -i PATH="$PATH" HOME="$HOME" ${DOCKER_CONFIG:+DOCKER_CONFIG="$DOCKER_CONFIG"} COMPOSE_PROFILES= \
    "${compose_cmd[@]}" --project-directory "$root" -f "$root/compose.yaml" "$@"
}
compose_with_env_profiles() {
  env -i PATH="$PATH" HOME="$HOME" ${DOCKER_CONFIG:+DOCKER_CONFIG="$DOCKER_CONFIG"} \
    "${compose_cmd[@]}" --project-directory "$root" -f "$root/compose.yaml" "$@"
}

# ---------------------------------------------------------------------------------------------
ensure_compose() {
  if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
  else
    local plugin_dir="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
    if [[ ! -x $plugin_dir/docker-compose ]]; then
      command -v go >/dev/null 2>&1 || die "docker compose is missing and there is no go to build it"
      echo "installing the Compose $COMPOSE_VERSION CLI plugin with go install (takes a few minutes)"
      local start=$SECONDS
      GOBIN="$tmp/gobin" go install \
        -ldflags "-X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
        "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION"
      mkdir -p "$plugin_dir"
      cp "$tmp/gobin/cmd" "$plugin_dir/docker-compose"
      chmod +x "$plugin_dir/docker-compose"
      echo "built in $((SECONDS - start))s: $plugin_dir/docker-compose"
    fi
    if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
      compose_cmd=(docker compose)
    else
      # No docker CLI (or it doesn't see the plugin): the plugin binary also runs on its own.
      "$plugin_dir/docker-compose" version >/dev/null || die "the compose plugin does not run"
      compose_cmd=("$plugin_dir/docker-compose")
    fi
  fi
  echo "using: ${compose_cmd[*]} ($("${compose_cmd[@]}" version --short 2>/dev/null || echo '?'))"
}

# ---------------------------------------------------------------------------------------------
# Profile sets that make sense, and the services each must enable.
profile_sets=(none gpu cpu local "gpu,local" "cpu,local")
declare -A expected_services=(
  [none]="gateway nats"
  [gpu]="gateway nats tei-gpu worker"
  [cpu]="gateway nats tei-cpu worker"
  [local]="gateway nats worker-local"
  [gpu,local]="gateway nats tei-gpu worker worker-local"
  [cpu,local]="gateway nats tei-cpu worker worker-local"
)

check_compose() {
  step "compose: docker compose config per profile set and env file"
  local env_files=("$root/.env.example")
  [[ -f $root/.env ]] && env_files+=("$root/.env")
  env_files+=(/dev/null)
  local env_file set label args services out tag tags=()
  for env_file in "${env_files[@]}"; do
    case $env_file in
      */.env.example) tag="env.example" ;;
      */.env) tag="env" ;;
      *) tag="defaults" ;;
    esac
    tags+=("$tag")
    for set in "${profile_sets[@]}"; do
      label="profiles=[${set}] env-file=${env_file#"$root"/}"
      args=(--env-file "$env_file")
      local p
      if [[ $set != none ]]; then
        for p in ${set//,/ }; do args+=(--profile "$p"); done
      fi
      if ! out=$(compose "${args[@]}" config -q 2>&1); then
        fail "$label: config -q: $out"
        continue
      fi
      [[ -n $out ]] && echo "      warnings: $out"
      services=$(compose "${args[@]}" config --services 2>/dev/null | sort | xargs)
      if [[ $services == "${expected_services[$set]}" ]]; then
        pass "$label: services: $services"
      else
        fail "$label: services are [$services], expected [${expected_services[$set]}]"
      fi
      compose "${args[@]}" config --format json >"$tmp/config-$tag-$set.json"
    done
    # The profiles the env file itself selects, if any (COMPOSE_PROFILES=...).
    if grep -Eq '^[[:space:]]*COMPOSE_PROFILES=' "$env_file"; then
      label="COMPOSE_PROFILES from ${env_file#"$root"/}"
      if out=$(compose_with_env_profiles --env-file "$env_file" config -q 2>&1); then
        pass "$label: valid, services: $(compose_with_env_profiles --env-file "$env_file" config --services | sort | xargs)"
      else
        fail "$label: config -q: $out"
      fi
    fi
  done

  for tag in "${tags[@]}"; do
    step "compose: structure, as rendered with ${tag/defaults/no env file}"
    if [[ ! -f $tmp/config-$tag-gpu,local.json || ! -f $tmp/config-$tag-cpu,local.json ]]; then
      fail "structure [$tag]: not checked, docker compose config failed above"
      continue
    fi
    check_structure "$tag"
  done
}

# check_structure TAG: checks the services rendered from one env file (config-TAG-*.json).
check_structure() {
  report python3 - "$tmp" "$1" <<'PY'
import json, re, sys

tmp, tag = sys.argv[1], sys.argv[2]
def load(name):
    with open(f"{tmp}/config-{tag}-{name}.json") as f:
        return json.load(f)["services"]

services = {}
for name in ("gpu,local", "cpu,local"):
    services.update(load(name))

def dur(s):
    """humantime-ish duration ('45s', '1m30s', '5ms') -> seconds."""
    total, units = 0.0, {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", str(s))
    if not parts or "".join(a + b for a, b in parts) != str(s).replace(" ", ""):
        raise ValueError(f"bad duration {s!r}")
    for n, u in parts:
        total += float(n) * units[u]
    return total

def check(ok, msg):
    print(("ok " if ok else "fail ") + f"[{tag}] " + msg)

for name in ("worker", "worker-local"):
    s = services[name]
    check("container_name" not in s and not s.get("ports"),
          f"{name}: scalable (no container_name, no published ports)")
    env = s.get("environment", {})
    check(dur(s.get("stop_grace_period", "10s")) > dur(env.get("SHUTDOWN_GRACE", "30s")),
          f"{name}: stop_grace_period {s.get('stop_grace_period')} > SHUTDOWN_GRACE {env.get('SHUTDOWN_GRACE')}")
    dep = s.get("depends_on", {}).get("nats", {})
    check(dep.get("condition") == "service_healthy" and dep.get("required", True),
          f"{name}: depends on nats being healthy")

for name, s in sorted(services.items()):
    hc = s.get("healthcheck", {})
    check(bool(hc.get("test")) and not hc.get("disable"), f"{name}: has a health check")

w, wl = services["worker"], services["worker-local"]
check(w["environment"].get("TEI_URL") == "http://tei:80", "worker: TEI_URL=http://tei:80")
check("TEI_URL" not in wl["environment"], "worker-local: no TEI_URL (built-in model)")
check(w["build"].get("target") == "worker" and wl["build"].get("target") == "worker-local"
      and services["gateway"]["build"].get("target") == "gateway", "Dockerfile targets per service")
for tei in ("tei-gpu", "tei-cpu"):
    dep = w["depends_on"].get(tei, {})
    check(dep.get("condition") == "service_healthy" and dep.get("required") is False,
          f"worker: waits for {tei} when enabled (service_healthy, required: false)")
    t = services[tei]
    image = t["image"]
    check(image.startswith("ghcr.io/huggingface/text-embeddings-inference:")
          and not image.endswith(":latest"), f"{tei}: pinned TEI image {image}")
    check("tei" in (t.get("networks", {}).get("default") or {}).get("aliases", []),
          f"{tei}: answers to the host name tei")
    need = max(int(w["environment"]["MAX_BATCH_SIZE"]), int(w["environment"]["MAX_CLIENT_BATCH_SIZE"]))
    got = int(t["environment"]["MAX_CLIENT_BATCH_SIZE"])
    check(got >= need, f"{tei}: MAX_CLIENT_BATCH_SIZE {got} >= max(MAX_BATCH_SIZE, MAX_CLIENT_BATCH_SIZE) {need}")
devices = (services["tei-gpu"].get("deploy", {}).get("resources", {})
           .get("reservations", {}).get("devices", []))
check(any("gpu" in d.get("capabilities", []) for d in devices), "tei-gpu: reserves GPU devices")
check(not services["tei-cpu"].get("deploy", {}).get("resources", {}).get("reservations"),
      "tei-cpu: no device reservation")
g = services["gateway"]
check(any(str(p.get("target")) == "8080" for p in g.get("ports", [])), "gateway: publishes 8080")
check(dur(g["healthcheck"]["timeout"]) > dur(g["environment"].get("HEALTH_TIMEOUT", "1s")),
      f"gateway: health check timeout {g['healthcheck']['timeout']} > HEALTH_TIMEOUT {g['environment'].get('HEALTH_TIMEOUT')}")
check(dur(g.get("stop_grace_period", "10s")) > dur(g["environment"].get("REQUEST_TIMEOUT", "30s")),
      f"gateway: stop_grace_period {g.get('stop_grace_period')} > REQUEST_TIMEOUT {g['environment'].get('REQUEST_TIMEOUT')}")
check(g["environment"].get("EMBATCH_SUBJECT") == w["environment"].get("EMBATCH_SUBJECT")
      == wl["environment"].get("EMBATCH_SUBJECT"), "gateway and workers share EMBATCH_SUBJECT")
n = services["nats"]
check(n["image"] == "nats:2.10-alpine", "nats: image nats:2.10-alpine")
check(any(v.get("target") == "/etc/nats/nats-server.conf" and v.get("source", "").endswith("/nats/nats.conf")
          for v in n.get("volumes", [])), "nats: mounts nats/nats.conf")
check("/healthz" in " ".join(n["healthcheck"]["test"]), "nats: health check on /healthz")
PY
}

# ---------------------------------------------------------------------------------------------
check_env_example() {
  step "env: .env.example vs compose.yaml"
  report python3 - "$root/compose.yaml" "$root/.env.example" <<'PY'
import re, sys

compose = open(sys.argv[1]).read()
# ${NAME}, ${NAME:-default}, ${NAME-default}, not $${...} (escaped, expanded in the container).
uses = {}
for m in re.finditer(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}", compose):
    name, default = m.group(1), m.group(2)
    if name in uses and uses[name] != default:
        print(f"fail compose.yaml: {name} has two defaults: {uses[name]!r} and {default!r}")
    uses[name] = default

example = {}
for n, line in enumerate(open(sys.argv[2]), 1):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
    if not m:
        print(f"fail .env.example:{n}: not NAME=value: {line!r}")
        continue
    example[m.group(1)] = m.group(2)

for name in sorted(set(uses) - set(example)):
    print(f"fail {name}: used in compose.yaml, missing from .env.example")
for name in sorted(set(example) - set(uses)):
    print(f"fail {name}: in .env.example, unused by compose.yaml")
for name in sorted(set(uses) & set(example)):
    if uses[name] is None:
        print(f"fail {name}: compose.yaml gives it no default (use ${{{name}:-...}})")
    elif uses[name] != example[name]:
        print(f"fail {name}: .env.example says {example[name]!r}, compose.yaml defaults to {uses[name]!r}")
print(f"ok .env.example and compose.yaml agree on {len(set(uses) & set(example))} variables and their defaults")
PY
}

# ---------------------------------------------------------------------------------------------
# Newest binary set: target/{release,debug} with both binaries, else cargo build (debug).
resolve_binaries() {
  if [[ -n ${EMBATCH_GATEWAY_BIN:-} || -n ${EMBATCH_WORKER_BIN:-} ]]; then
    [[ -n ${EMBATCH_GATEWAY_BIN:-} && -n ${EMBATCH_WORKER_BIN:-} ]] ||
      die "set both EMBATCH_GATEWAY_BIN and EMBATCH_WORKER_BIN, or neither"
    gateway_bin=$EMBATCH_GATEWAY_BIN
    worker_bin=$EMBATCH_WORKER_BIN
    return
  fi
  local target_dir=${CARGO_TARGET_DIR:-$root/target} best="" profile
  for profile in release debug; do
    if [[ -x $target_dir/$profile/embatch-gateway && -x $target_dir/$profile/embatch-worker ]]; then
      if [[ -z $best || $target_dir/$profile/embatch-worker -nt $best/embatch-worker ]]; then
        best=$target_dir/$profile
      fi
    fi
  done
  if [[ -z $best ]]; then
    echo "no built binaries in $target_dir/{release,debug}: cargo build -p embatch-gateway -p embatch-worker"
    cargo build -p embatch-gateway -p embatch-worker || return 1
    best=$target_dir/debug
  fi
  gateway_bin=$best/embatch-gateway
  worker_bin=$best/embatch-worker
}

check_flags() {
  step "flags: compose environment vs the binaries' --help"
  local gateway_bin worker_bin
  if ! resolve_binaries; then
    fail "flags: not checked, cargo build failed"
    return
  fi
  echo "gateway: $gateway_bin"
  echo "worker:  $worker_bin"
  # Clean environment: clap then prints `[env: NAME=]` without current values.
  if ! env -i PATH="$PATH" "$gateway_bin" --help >"$tmp/help-gateway.txt" ||
    ! env -i PATH="$PATH" "$worker_bin" --help >"$tmp/help-worker.txt"; then
    fail "flags: not checked, --help failed"
    return
  fi
  local config=$tmp/config-env.example-gpu,local.json
  if [[ ! -f $config ]] &&
    ! compose --env-file "$root/.env.example" --profile gpu --profile local config --format json \
      >"$config"; then
    rm -f "$config"
    fail "flags: not checked, docker compose config failed"
    return
  fi
  report python3 - "$tmp" <<'PY'
import json, re, sys

tmp = sys.argv[1]
services = json.load(open(f"{tmp}/config-env.example-gpu,local.json"))["services"]
helps = {b: open(f"{tmp}/help-{b}.txt").read() for b in ("gateway", "worker")}
# Read by the binaries but not clap flags.
not_flags = {"RUST_LOG"}
for service, binary in (("gateway", "gateway"), ("worker", "worker"), ("worker-local", "worker")):
    env = services[service].get("environment", {})
    help_env = set(re.findall(r"\[env: ([A-Za-z_][A-Za-z0-9_]*)=", helps[binary]))
    if not help_env:
        print(f"fail {service}: embatch-{binary} --help lists no [env: NAME=] at all")
        continue
    bad = sorted(n for n in env if n not in help_env and n not in not_flags)
    if bad:
        for n in bad:
            print(f"fail {service}: sets {n}, which embatch-{binary} --help does not list as [env: {n}=]")
    else:
        print(f"ok {service}: all {len(env)} variables are flags of embatch-{binary} (or {', '.join(sorted(not_flags))})")
    unset = sorted(help_env - set(env))
    if unset:
        print(f"info {service}: left at the binary's default: {', '.join(unset)}")
PY
}

# ---------------------------------------------------------------------------------------------
find_nats_server() {
  if [[ -n ${NATS_SERVER:-} ]]; then
    nats_server=$NATS_SERVER
  elif command -v nats-server >/dev/null 2>&1; then
    nats_server=$(command -v nats-server)
  elif command -v go >/dev/null 2>&1 && [[ -x $(go env GOPATH)/bin/nats-server ]]; then
    nats_server=$(go env GOPATH)/bin/nats-server
  else
    command -v go >/dev/null 2>&1 || die "no nats-server and no go to install it"
    echo "installing nats-server $NATS_SERVER_VERSION with go install"
    go install "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION"
    nats_server=$(go env GOPATH)/bin/nats-server
  fi
}

free_ports() { # free_ports N: N distinct free TCP ports on 127.0.0.1
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# monitor_json PORT PATH: GET http://127.0.0.1:PORT/PATH, retrying up to ~10s.
monitor_json() {
  python3 - "$1" "$2" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/{sys.argv[2]}"
for _ in range(100):
    try:
        print(urllib.request.urlopen(url, timeout=1).read().decode())
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"no answer from {url}")
PY
}

# route_peers PORT: names of the servers the node with monitoring PORT has routes to.
route_peers() {
  python3 - "$1" <<'PY'
import json, sys, urllib.request
try:
    routez = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/routez", timeout=1))
    print(" ".join(sorted({r["remote_name"] for r in routez.get("routes") or []})))
except OSError:
    pass
PY
}

json_get() { python3 -c 'import json,sys; print(eval("d"+sys.argv[1], {"d": json.load(sys.stdin)}))' "$1"; }

check_nats() {
  step "nats: config files"
  local nats_server
  find_nats_server
  echo "using: $nats_server ($("$nats_server" --version))"
  local f out
  for f in nats/nats.conf nats/cluster/n1.conf nats/cluster/n2.conf nats/cluster/n3.conf; do
    if out=$("$nats_server" -c "$f" -t 2>&1); then
      pass "$f: nats-server -t: $out"
    else
      fail "$f: nats-server -t: $out"
    fi
  done

  # The single-node config, on free loopback ports instead of its 0.0.0.0:4222/8222: a wrapper
  # config includes it (include paths are relative to the including file) and overrides both.
  local ports client monitor varz
  read -r client monitor <<<"$(free_ports 2)"
  printf 'include "%s"\nlisten: 127.0.0.1:%s\nhttp: 127.0.0.1:%s\n' \
    "$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$root/nats/nats.conf" "$tmp")" \
    "$client" "$monitor" >"$tmp/nats-loopback.conf"
  "$nats_server" -c "$tmp/nats-loopback.conf" >"$tmp/nats.log" 2>&1 &
  pids+=($!)
  if varz=$(monitor_json "$monitor" varz) &&
    [[ $(json_get '["max_payload"]' <<<"$varz") == "$EXPECTED_MAX_PAYLOAD" ]] &&
    [[ $(json_get '["port"]' <<<"$varz") == "$client" ]]; then
    pass "nats/nats.conf: starts (on 127.0.0.1:$client); max_payload=$EXPECTED_MAX_PAYLOAD"
  else
    fail "nats/nats.conf: did not start with max_payload=$EXPECTED_MAX_PAYLOAD (log: $(tail -n 5 "$tmp/nats.log"))"
  fi
  kill "${pids[-1]}" 2>/dev/null || true

  # The cluster configs, every port overridden: -p CLIENT -m MONITOR --cluster URL --routes URLS.
  read -r -a ports <<<"$(free_ports 9)"
  local i j routes
  for i in 0 1 2; do
    routes=""
    for j in 0 1 2; do
      [[ $i == "$j" ]] && continue
      routes+="${routes:+,}nats://127.0.0.1:${ports[$((6 + j))]}"
    done
    "$nats_server" -c "nats/cluster/n$((i + 1)).conf" -p "${ports[$i]}" -m "${ports[$((3 + i))]}" \
      --cluster "nats://127.0.0.1:${ports[$((6 + i))]}" --routes "$routes" \
      >"$tmp/n$((i + 1)).log" 2>&1 &
    pids+=($!)
  done
  local name peers deadline got
  for i in 0 1 2; do
    name=n$((i + 1))
    deadline=$((SECONDS + 15))
    peers=""
    while ((SECONDS < deadline)); do
      peers=$(route_peers "${ports[$((3 + i))]}")
      [[ $(wc -w <<<"$peers") -ge 2 ]] && break
      sleep 0.2
    done
    varz=$(monitor_json "${ports[$((3 + i))]}" varz 2>/dev/null || echo '{}')
    got=$(json_get '.get("server_name"), d.get("port"), (d.get("cluster") or {}).get("cluster_port"), d.get("max_payload")' <<<"$varz")
    if [[ $(wc -w <<<"$peers") -ge 2 ]] &&
      [[ $got == "('$name', ${ports[$i]}, ${ports[$((6 + i))]}, $EXPECTED_MAX_PAYLOAD)" ]]; then
      pass "nats/cluster/$name.conf: clustered with [$peers] on overridden ports" \
        "(client ${ports[$i]}, monitor ${ports[$((3 + i))]}, route ${ports[$((6 + i))]}), max_payload=$EXPECTED_MAX_PAYLOAD"
    else
      fail "nats/cluster/$name.conf: routes to [$peers]; (server_name, port, cluster_port, max_payload) = $got," \
        "expected ('$name', ${ports[$i]}, ${ports[$((6 + i))]}, $EXPECTED_MAX_PAYLOAD) (log: $(tail -n 3 "$tmp/$name.log"))"
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# A small Go program on BuildKit's own Dockerfile frontend: `lint` converts each target to LLB with
# the linter on (an image resolver that answers without a registry, and refuses unpinned images,
# which also catches a mistyped `COPY --from=stage`); `context` applies .dockerignore to the tree.
dfcheck_go() {
  cat <<'GO'
package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerui"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	digest "github.com/opencontainers/go-digest"
)

type resolver struct{}

func (resolver) ResolveImageConfig(ctx context.Context, ref string, opt sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	if strings.HasSuffix(ref, ":latest") {
		return "", "", nil, fmt.Errorf("image %q: base images must carry an explicit tag (or is this a mistyped stage name?)", ref)
	}
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}}`)
	return ref, digest.FromBytes(cfg), cfg, nil
}

func lint(path string, targets []string) bool {
	dt, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("fail", err)
		return false
	}
	ok := true
	for _, target := range targets {
		var warnings []string
		st, _, _, _, err := dockerfile2llb.Dockerfile2LLB(context.Background(), dt, dockerfile2llb.ConvertOpt{
			Config:       dockerui.Config{Target: target},
			MetaResolver: resolver{},
			AllStages:    target == "",
			Warn: func(rule, description, url, msg string, location []parser.Range) {
				line := 0
				if len(location) > 0 {
					line = location[0].Start.Line
				}
				warnings = append(warnings, fmt.Sprintf("%s (line %d): %s", rule, line, msg))
			},
		})
		name := target
		if name == "" {
			name = "all stages"
		}
		if err != nil {
			fmt.Printf("fail Dockerfile [%s]: %v\n", name, err)
			ok = false
			continue
		}
		def, err := st.Marshal(context.Background())
		if err != nil {
			fmt.Printf("fail Dockerfile [%s]: %v\n", name, err)
			ok = false
			continue
		}
		for _, w := range warnings {
			fmt.Printf("fail Dockerfile [%s]: lint %s\n", name, w)
			ok = false
		}
		if len(warnings) == 0 {
			fmt.Printf("ok Dockerfile [%s]: converts to a build graph of %d operations, no lint warnings\n", name, len(def.Def))
		}
	}
	return ok
}

// checkContext applies ROOT/.dockerignore; +path must be in the build context, -path must not.
func checkContext(root string, specs []string) bool {
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		fmt.Println("fail", err)
		return false
	}
	patterns, err := ignorefile.ReadAll(f)
	f.Close()
	if err != nil {
		fmt.Println("fail .dockerignore:", err)
		return false
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		fmt.Println("fail .dockerignore:", err)
		return false
	}
	included := map[string]bool{}
	var size int64
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return err
		}
		if excluded {
			if d.IsDir() && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			included[rel] = true
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		fmt.Println("fail", err)
		return false
	}
	has := func(path string) bool {
		for f := range included {
			if f == path || strings.HasPrefix(f, path+"/") {
				return true
			}
		}
		return false
	}
	ok := true
	for _, spec := range specs {
		path := spec[1:]
		switch {
		case spec[0] == '+' && !has(path):
			fmt.Printf("fail .dockerignore: %s is not in the build context\n", path)
			ok = false
		case spec[0] == '-' && has(path):
			fmt.Printf("fail .dockerignore: %s is in the build context\n", path)
			ok = false
		}
	}
	if ok {
		fmt.Printf("ok .dockerignore: build context of %d files, %.1f MiB, holds what the build needs and none of the excluded paths\n", len(included), float64(size)/(1<<20))
	}
	return ok
}

func main() {
	ok := false
	switch {
	case len(os.Args) >= 3 && os.Args[1] == "lint":
		ok = lint(os.Args[2], os.Args[3:])
	case len(os.Args) >= 3 && os.Args[1] == "context":
		ok = checkContext(os.Args[2], os.Args[3:])
	default:
		fmt.Println("fail usage: dfcheck lint DOCKERFILE TARGET... | dfcheck context ROOT +PATH|-PATH...")
	}
	if !ok {
		os.Exit(1)
	}
}
GO
}

build_dfcheck() {
  command -v go >/dev/null 2>&1 || die "go is needed for the Dockerfile check (or COMPOSE_CHECK_SKIP=docker)"
  local src hash dir
  src=$(dfcheck_go)
  hash=$(printf '%s\n%s\n' "$BUILDKIT_VERSION" "$src" | sha256sum | cut -c1-16)
  dir=${XDG_CACHE_HOME:-$HOME/.cache}/embatch-compose-check/dfcheck-$hash
  dfcheck=$dir/dfcheck
  [[ -x $dfcheck ]] && return
  echo "building the Dockerfile checker (BuildKit $BUILDKIT_VERSION) in $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  printf '%s\n' "$src" >"$dir/main.go"
  printf 'module dfcheck\n\ngo 1.22\n\nrequire github.com/moby/buildkit %s\n' "$BUILDKIT_VERSION" >"$dir/go.mod"
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 && go build -o dfcheck.tmp . && mv dfcheck.tmp dfcheck) ||
    { rm -rf "$dir"; die "could not build the Dockerfile checker"; }
}

check_docker() {
  step "docker: Dockerfile and .dockerignore"
  local dfcheck
  build_dfcheck
  local targets
  targets=$(sed -n 's/^FROM .* AS \([a-z0-9-]*\)$/\1/p' Dockerfile | xargs)
  echo "stages: $targets"
  local specs=(+Cargo.toml +Cargo.lock +scripts/fetch-model.sh
    -.git -target -models -.env -compose.yaml -nats)
  local member
  for member in $(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("Cargo.toml","rb"))["workspace"]["members"]))'); do
    specs+=("+$member/Cargo.toml" "+$member/src")
  done
  report "$dfcheck" lint Dockerfile "" gateway worker worker-local
  report "$dfcheck" context "$root" "${specs[@]}"
}

# ---------------------------------------------------------------------------------------------
if enabled compose || enabled env || enabled flags; then
  ensure_compose
fi
enabled compose && check_compose
enabled env && check_env_example
enabled flags && check_flags
enabled nats && check_nats
enabled docker && check_docker

echo
echo "compose-check: $passed passed, $failed failed"
((failed == 0))
