#!/usr/bin/env bash
# A fresh worker's first burst, RUNS times: each run starts a nats-server (JetStream, temporary
# store), the GPU-like fake upstream, one worker and one gateway, sends 8 closed-loop callers
# of 512 distinct inputs for 4 s, and counts the run as stalled when nothing was answered.
# Usage: loadtest/first_burst.sh [RUNS] (default 30); BIN= a folder of release binaries.
# Prints one line per run and "stalled: N of RUNS". See docs/design/tokio-pin.md.
set -u
runs=${1:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
B=${BIN:-$here/target/release}
nats_bin=${NATS_SERVER_BIN:-$here/.bin/nats-server}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
stalled=0
for run in $(seq "$runs"); do
  d=$(mktemp -d /tmp/embatch-burst.XXXXXX)
  np_port=$(free_port)
  printf 'port: %s\nmax_payload: 8MB\njetstream { store_dir: "%s/js" }\n' "$np_port" "$d" > "$d/nats.conf"
  "$nats_bin" -c "$d/nats.conf" -a 127.0.0.1 > "$d/nats.log" 2>&1 & np=$!
  sleep 0.5; url=nats://127.0.0.1:$np_port
  "$B/embatch-loadtest" fake-upstream --listen 127.0.0.1:0 --base-ms 5 --per-input-us 20 \
    --concurrency 1 --dim 384 > "$d/up.log" 2>&1 & up=$!
  for _ in $(seq 50); do [ -s "$d/up.log" ] && break; sleep 0.1; done
  ua=$(head -1 "$d/up.log" | awk '{print $3}')
  NATS_URL=$url TEI_URL=http://$ua METRICS_ADDR=127.0.0.1:0 "$B/embatch-worker" > "$d/worker.log" 2>&1 & wp=$!
  sleep 1.5
  port=$(free_port)
  NATS_URL=$url LISTEN_ADDR=127.0.0.1:$port "$B/embatch-gateway" > "$d/gw.log" 2>&1 & gp=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.1; done
  "$B/embatch-loadtest" run --url "http://127.0.0.1:$port/embed" -c 8 -k 512 -d 4s --warmup 1s \
    --timeout 35s --quiet > "$d/load.log" 2>&1
  goodput=$(grep -E "^goodput" "$d/load.log")
  if grep -q "goodput     0.0 req/s" "$d/load.log"; then
    stalled=$((stalled + 1)); echo "run $run: STALLED ($d kept)"
  else
    echo "run $run: $goodput"
  fi
  kill -9 $gp $wp $up $np 2> /dev/null; wait 2> /dev/null
  grep -q "goodput     0.0 req/s" "$d/load.log" || rm -rf "$d"
done
echo "stalled: $stalled of $runs"
