#!/usr/bin/env bash
# CPU per request of two builds, in alternating pairs on the same machine: benchmark 4's setup
# (instant fake upstream, closed loop), one stack per run, so a before/after comparison survives a
# noisy machine. For each run it prints req/s, p50/p99, the failures and the CPU time (utime +
# stime from /proc/PID/stat over the run) each process spent per request, in µs.
#
# Usage: loadtest/compare_cpu.sh BEFORE_DIR AFTER_DIR [PAIRS] [PATH] [CONCURRENCY] [SECONDS]
#   BEFORE_DIR, AFTER_DIR: directories with embatch-gateway and embatch-worker (e.g. a release
#   build of an older commit, and target/release). The load generator and the fake upstream are
#   always target/release/embatch-loadtest, so both builds see the same instrument.
#   PATH: gateway (default), nats or direct.
# Environment: BEFORE_ENV / AFTER_ENV: settings (space-separated NAME=VALUE) for the gateway and
# the worker of that side, e.g. AFTER_ENV=TOKIO_WORKER_THREADS=1 with the same build on both
# sides to measure a setting; UPSTREAM_ARGS: the fake upstream's cost model (default instant:
# `--base-ms 0 --per-input-us 0 --concurrency 64`; GPU-like: `--base-ms 5 --per-input-us 20
# --concurrency 1`); LOAD_ARGS: the load instead of the closed loop (e.g. `--rate 9000`, open
# loop); GATEWAY_ENV: the gateway's settings (default `REQUEST_TIMEOUT=2s`; empty for its
# defaults); PROFILE=gateway|worker|nats-server records `perf record -g` of that process for 4 s
# in each run (perf.data in the run's temp dir, its path printed on stderr, perf's own output in
# perf.log there; PERF_ARGS replaces `-g`, e.g. `--call-graph dwarf,16384` where frame pointers
# lose the callers; nats-server's Go frames keep them); NATS_ARGS: nats-server's arguments
# beyond its address (default `-js`: JetStream, as the stack and the bench run it, so the
# worker's default cache writes to its bucket; its store goes in the run's temp dir, removed
# after the run, unless NATS_ARGS names one with `-sd`; empty for core NATS alone);
# NATS_NODES: nats-servers in one cluster (default 1), each with JetStream on a store of its
# own; the worker and the gateway connect to the first, the CPU of all of them counts as
# nats-server's, and the bucket's replicas follow the worker's JETSTREAM_REPLICAS (`auto`: 3 on
# 3 nodes or more); NATS_SERVER_BIN as for the tests;
# LOAD_KEYS: space-separated tenant API keys, one closed loop per key sharing CONCURRENCY
# (tenants contending; the req/s add up, p50 and p99 are the worst tenant's).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
before=$1 after=$2 pairs=${3:-3} path=${4:-gateway} conc=${5:-256} secs=${6:-6}
loadtest="$repo/target/release/embatch-loadtest"
nats_server=${NATS_SERVER_BIN:-$("$repo/scripts/install-nats-server.sh")}
case ${PROFILE:-} in
  "" | gateway | worker | nats-server) ;;
  *) echo "PROFILE must be gateway, worker or nats-server" >&2; exit 1 ;;
esac
# The current run's processes and temp dir (set by `run`), stopped and its JetStream store
# removed when the script ends early as well.
pids=() tmp=""
trap '[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; [ -z "$tmp" ] || rm -rf "$tmp/js"' EXIT

# Starts NATS_NODES nats-servers (one by default) for the run in $tmp; sets nats_url (the
# first's), nats_pid (the first's, for PROFILE), nats_pids (all, comma-separated) and
# nats_mons (their monitoring ports, comma-separated).
start_nats() {
  local nodes=${NATS_NODES:-1} i args
  local base_args=${NATS_ARGS--js}
  local ports routes=""
  # Client, cluster and monitoring ports of every node, chosen before any starts (routes).
  read -ra ports <<<"$(python3 -c 'import socket,sys
socks=[socket.socket() for _ in range(3 * int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$nodes")"
  for ((i = 0; i < nodes; i++)); do routes+="${routes:+,}nats://127.0.0.1:${ports[3 * i + 1]}"; done
  nats_pids=""
  for ((i = 0; i < nodes; i++)); do
    args="$base_args"
    if [[ " $args " =~ \ --?(js|jetstream)\  && ! " $args " =~ \ --?(sd|store_dir)\  ]]; then
      args+=" -sd $tmp/js/n$i"
    fi
    if ((nodes > 1)); then
      args+=" -n n$i --cluster_name bench --cluster nats://127.0.0.1:${ports[3 * i + 1]} --routes $routes"
    fi
    # shellcheck disable=SC2086 # a list of arguments
    "$nats_server" -a 127.0.0.1 -p "${ports[3 * i]}" -m "${ports[3 * i + 2]}" $args >"$tmp/nats$i.log" 2>&1 &
    pids+=($!); nats_pids+="${nats_pids:+,}$!"
    ((i > 0)) || nats_pid=$!
  done
  nats_url="nats://127.0.0.1:${ports[0]}"
  nats_mons=""
  for ((i = 0; i < nodes; i++)); do nats_mons+="${nats_mons:+,}${ports[3 * i + 2]}"; done
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:${ports[2]}/healthz" >/dev/null && break; sleep 0.1; done
  if ((nodes > 1)); then
    # The first node routes to every other (the worker's `auto` replicas count the nodes its
    # server advertises), and the cluster's JetStream has a meta leader to take requests.
    local routes_up
    for _ in $(seq 150); do
      routes_up=$(curl -sf "http://127.0.0.1:${ports[2]}/routez" |
        python3 -c 'import json,sys; print(len({r.get("remote_id") for r in json.load(sys.stdin).get("routes") or []}))' || echo 0)
      ((routes_up >= nodes - 1)) && curl -sf "http://127.0.0.1:${ports[2]}/jsz" | grep -q '"leader"' && break
      sleep 0.2
    done
  fi
}

# One run against the build in $1; prints one line.
run() {
  local bin=$1 label=$2 settings=$3
  pids=() tmp=$(mktemp -d)
  # The JetStream store goes with the run (up to the bucket's 1 GiB); perf data stays.
  trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp/js"; pids=()' RETURN
  local nats_url nats_pid
  start_nats
  # shellcheck disable=SC2086 # a list of arguments
  "$loadtest" fake-upstream ${UPSTREAM_ARGS:---base-ms 0 --per-input-us 0 --concurrency 64} >"$tmp/up.log" 2>&1 &
  local up_pid=$!; pids+=("$up_pid")
  for _ in $(seq 50); do [ -s "$tmp/up.log" ] && break; sleep 0.1; done
  local up_addr
  up_addr=$(head -1 "$tmp/up.log" | awk '{print $3}')
  # shellcheck disable=SC2086 # $settings is a list of NAME=VALUE words
  env $settings NATS_URL="$nats_url" TEI_URL="http://$up_addr" METRICS_ADDR=127.0.0.1:0 \
    "$bin/embatch-worker" >"$tmp/worker.log" 2>&1 &
  local worker_pid=$!; pids+=("$worker_pid")
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2086
  env $settings ${GATEWAY_ENV-REQUEST_TIMEOUT=2s} NATS_URL="$nats_url" LISTEN_ADDR="127.0.0.1:$port" \
    "$bin/embatch-gateway" >"$tmp/gateway.log" 2>&1 &
  local gateway_pid=$!; pids+=("$gateway_pid")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  local target
  case $path in
    gateway) target=(--url "http://127.0.0.1:$port/embed") ;;
    nats) target=(--nats "$nats_url") ;;
    direct) target=(--url "http://$up_addr/embed") ;;
    *) echo "PATH must be gateway, nats or direct" >&2; return 1 ;;
  esac
  cpu() { local t=0 p; for p in ${1//,/ }; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
  # nats-server's entry is every node's pid, comma-separated: their CPU is summed.
  local names=(gateway worker nats-server fake-upstream) procs=("$gateway_pid" "$worker_pid" "$nats_pids" "$up_pid") start=() end=()
  for p in "${procs[@]}"; do start+=("$(cpu "$p")"); done
  local load_pids=() reports=()
  if [ -n "${LOAD_KEYS:-}" ]; then
    # One closed loop per tenant key, the concurrency split evenly, each with its own inputs.
    local keys i=0
    read -ra keys <<<"$LOAD_KEYS"
    for key in "${keys[@]}"; do
      i=$((i + 1))
      EMBATCH_API_KEY=$key "$loadtest" run "${target[@]}" -c $((conc / ${#keys[@]})) --seed "$i" \
        -d "${secs}s" --timeout 2s --json "$tmp/report$i.json" --quiet >"$tmp/load$i.log" 2>&1 &
      load_pids+=($!); reports+=("$tmp/report$i.json")
    done
  else
    # shellcheck disable=SC2086 # a list of arguments
    "$loadtest" run "${target[@]}" ${LOAD_ARGS:--c $conc} -d "${secs}s" --timeout 2s --json "$tmp/report.json" --quiet >"$tmp/load.log" 2>&1 &
    load_pids+=($!); reports+=("$tmp/report.json")
  fi
  if [ -n "${PROFILE:-}" ]; then
    local profiled=$gateway_pid
    [ "$PROFILE" = worker ] && profiled=$worker_pid
    [ "$PROFILE" = nats-server ] && profiled=$nats_pid
    sleep 1
    # shellcheck disable=SC2086 # a list of arguments
    perf record ${PERF_ARGS:--g} -o "$tmp/perf.data" -p "$profiled" -- sleep 4 >"$tmp/perf.log" 2>&1 || true
    if [ -s "$tmp/perf.data" ]; then
      echo "perf data: $tmp/perf.data" >&2
    else
      echo "perf recorded nothing: see $tmp/perf.log" >&2
    fi
  fi
  wait "${load_pids[@]}"
  for p in "${procs[@]}"; do end+=("$(cpu "$p")"); done
  # What the run measured: the cache bucket's replicas as the servers report them (`-` where
  # there is no bucket: core NATS, CACHE=false).
  local bucket
  bucket=$(python3 - "$nats_mons" <<'PY'
import json, sys, urllib.request
seen = set()
for port in sys.argv[1].split(","):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz?streams=true&config=true", timeout=2) as r:
            jsz = json.load(r)
    except (OSError, ValueError):
        continue
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream["name"] == "KV_embatch_cache":
                seen.add(stream["config"].get("num_replicas", 1))
print("/".join(f"R{n}" for n in sorted(seen)) or "-")
PY
)
  local ticks=()
  for i in "${!procs[@]}"; do ticks+=("${names[$i]}=$(( end[i] - start[i] ))"); done
  BUCKET=$bucket python3 - "$(IFS=,; echo "${reports[*]}")" "$label" "$(getconf CLK_TCK)" "${ticks[@]}" <<'PY'
import json, os, sys
# Several reports (one per tenant key): counts and rates add up; p50 and p99 are the worst
# tenant's.
reports = [json.load(open(path)) for path in sys.argv[1].split(",")]
label, hz = sys.argv[2], int(sys.argv[3])
sent = max(1, sum(r["requests"]["sent"] for r in reports))
cpu = " ".join(f"{name} {int(t) * 1e6 / hz / sent:.1f}"
               for name, t in (kv.split("=") for kv in sys.argv[4:]))
rate = sum(r["throughput"]["requests_per_s"] for r in reports)
goodput = sum(r["goodput"]["requests_per_s"] for r in reports)
p50 = max(r["latency"]["p50_ms"] or 0 for r in reports)
p99 = max(r["latency"]["p99_ms"] or 0 for r in reports)
failures = {}
for r in reports:
    for kind, n in (r["failures"] or {}).items():
        failures[kind] = failures.get(kind, 0) + n
print(f"{label:<7} {rate:>8,.0f} req/s  goodput {goodput:,.0f}  p50 {p50} ms  "
      f"p99 {p99} ms  failures {failures or 0}  µs/req: {cpu}  cache bucket {os.environ['BUCKET']}")
PY
}

echo "path $path, ${LOAD_ARGS:-closed loop c=$conc}, ${secs} s per run, $pairs pairs, nats-server ${NATS_ARGS--js} x ${NATS_NODES:-1}; load average $(cut -d' ' -f1 /proc/loadavg)"
for _ in $(seq "$pairs"); do
  run "$before" before "${BEFORE_ENV:-}"
  run "$after" after "${AFTER_ENV:-}"
done
