#!/usr/bin/env bash
# N fake-upstream replicas behind one worker, closed loop through the gateway.
# Usage: loadtest/replicas.sh ["1 2 4"] [ROUNDS] [CONC] [SECS]; LOAD_ARGS="-k 8" for 8-input requests.
# Each run: a fresh nats-server, N fake-upstream processes (GPU-like, one call at a time) listed
# in one worker's TEI_URL, one gateway (REQUEST_TIMEOUT=2s), a closed loop of distinct inputs.
# Results: docs/benchmarks.md, "Upstream replicas behind one worker".
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/target/release
ns=${1:-"1 2 4"} rounds=${2:-2} conc=${3:-256} secs=${4:-6}
nats_server=${NATS_SERVER_BIN:-$repo/.bin/nats-server}
run() {
  local n=$1 tmp pids=()
  tmp=$(mktemp -d)
  trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' RETURN
  "$nats_server" -a 127.0.0.1 -p 0 -ports_file_dir "$tmp" >"$tmp/nats.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do compgen -G "$tmp/*.ports" >/dev/null && break; sleep 0.1; done
  local nats_url urls=""
  nats_url=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["nats"][0])' "$tmp"/*.ports)
  for i in $(seq "$n"); do
    "$bin/embatch-loadtest" fake-upstream --concurrency 1 --base-ms 5 --per-input-us 20 --dim 384 >"$tmp/up$i.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do [ -s "$tmp/up$i.log" ] && break; sleep 0.1; done
    urls+="${urls:+,}http://$(head -1 "$tmp/up$i.log" | awk '{print $3}')"
  done
  NATS_URL="$nats_url" TEI_URL="$urls" METRICS_ADDR=127.0.0.1:0 \
    "$bin/embatch-worker" >"$tmp/worker.log" 2>&1 &
  pids+=($!)
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  REQUEST_TIMEOUT=2s NATS_URL="$nats_url" LISTEN_ADDR="127.0.0.1:$port" "$bin/embatch-gateway" >"$tmp/gateway.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  sleep 1
  "$bin/embatch-loadtest" run --url "http://127.0.0.1:$port/embed" -c "$conc" ${LOAD_ARGS:-} -d "${secs}s" --timeout 2s --json "$tmp/report.json" --quiet >"$tmp/load.log" 2>&1
  python3 - "$tmp/report.json" "$n" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"replicas {sys.argv[2]}: {r['throughput']['requests_per_s']:,.0f} req/s  goodput {r['goodput']['requests_per_s']:,.0f} req/s {r['goodput']['inputs_per_s']:,.0f} inputs/s  p50 {r['latency']['p50_ms']} ms  "
      f"p99 {r['latency']['p99_ms']} ms  failures {r['failures'] or 0}  load avg {sys.argv[3]}")
PY
}
echo "closed loop c=$conc, ${secs} s per run, $rounds rounds, worker defaults (MAX_CONCURRENT_BATCHES: 2 per replica)"
for _ in $(seq "$rounds"); do for n in $ns; do run "$n"; done; done
