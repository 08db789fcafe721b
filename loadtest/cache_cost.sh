#!/usr/bin/env bash
# What the embeddings cache costs when no input repeats: one worker on the GPU-like fake upstream
# (5 ms + 20 µs/input, one call at a time), nats-server with JetStream on a temp store, an open
# loop of unique single-input requests over NATS (each run its own seed). Runs the settings
# given, in turn, RUNS times, one fresh stack per run, and prints per run the loadtest's p50/p99
# and the CPU (utime + stime from /proc/PID/stat, whole run, ms) of the worker and nats-server.
#
# Usage: loadtest/cache_cost.sh [RUNS] [RATE] [SECONDS] -- 'LABEL=SETTINGS' ...
#   SETTINGS: space-separated NAME=VALUE for the worker, e.g.
#     loadtest/cache_cost.sh 2 2837 10 -- 'off=CACHE=false' 'on=' 'lru-only=CACHE_BUCKET='
# Environment: WORKER_BIN (default target/release/embatch-worker), NATS_SERVER_BIN as for the
# tests. The fake upstream and the load generator are target/release/embatch-loadtest.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-2} rate=${2:-2837} secs=${3:-10}
shift $(( $# >= 3 ? 3 : $# ))
[[ ${1:-} == -- ]] && shift
(( $# > 0 )) || set -- 'off=CACHE=false' 'on='
loadtest="$repo/target/release/embatch-loadtest"
worker=${WORKER_BIN:-$repo/target/release/embatch-worker}
nats_server=${NATS_SERVER_BIN:-$("$repo/scripts/install-nats-server.sh")}

cpu_ms() { awk '{ print ($14 + $15) * 10 }' "/proc/$1/stat"; }

# One run with the worker settings in $2; prints one line labelled $1.
run() {
  local label=$1 settings=$2 seed=$3 tmp pids=()
  tmp=$(mktemp -d)
  trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' RETURN
  "$nats_server" -a 127.0.0.1 -p 0 -js -sd "$tmp/store" -ports_file_dir "$tmp" \
    >"$tmp/nats.log" 2>&1 &
  local nats_pid=$!; pids+=("$nats_pid")
  for _ in $(seq 50); do compgen -G "$tmp/*.ports" >/dev/null && break; sleep 0.1; done
  local nats_url
  nats_url=$(grep -o 'nats://[^"]*' "$tmp"/*.ports | head -1)
  "$loadtest" fake-upstream --listen 127.0.0.1:0 >"$tmp/upstream.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do [[ -s $tmp/upstream.out ]] && break; sleep 0.1; done
  local upstream
  upstream=$(head -1 "$tmp/upstream.out" | awk '{ print $3 }')
  # shellcheck disable=SC2086 # settings are words on purpose
  env NATS_URL="$nats_url" TEI_URL="http://$upstream" METRICS_ADDR=127.0.0.1:0 $settings \
    "$worker" >"$tmp/worker.log" 2>&1 &
  local worker_pid=$!; pids+=("$worker_pid")
  sleep 2
  local summary
  summary=$("$loadtest" run --nats "$nats_url" --rate "$rate" --duration "${secs}s" \
    --warmup 2s --seed "$seed" --quiet 2>&1 | grep -o 'p50 [0-9.]* ms\|p99 [0-9.]* ms' | tr '\n' ' ')
  printf '%-12s %s worker %s ms, nats-server %s ms CPU\n' "$label" "$summary" \
    "$(cpu_ms "$worker_pid")" "$(cpu_ms "$nats_pid")"
}

seed=1
for _ in $(seq "$runs"); do
  for spec in "$@"; do
    run "${spec%%=*}" "${spec#*=}" "$seed"
    seed=$((seed + 1))
  done
done
