#!/usr/bin/env bash
# One command, fresh clone to real embeddings: installs what is missing (nats-server, the model
# weights, release builds, nats-py for the direct-NATS example), starts nats-server, one worker on
# the built-in CPU model and the gateway, embeds real sentences through POST /embed and through a
# direct NATS request, prints them, and stops everything it started.
#
# Usage: scripts/quickstart.sh [--keep]     --keep leaves the stack running (Ctrl-C stops it).
# Ports: NATS 4222 (monitoring 8222), gateway 8080, worker metrics 9091; override with
#        NATS_PORT, GATEWAY_PORT, WORKER_METRICS_PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

keep=false
[ "${1:-}" = "--keep" ] && keep=true
nats_port=${NATS_PORT:-4222}
gateway_port=${GATEWAY_PORT:-8080}
metrics_port=${WORKER_METRICS_PORT:-9091}
run_dir=.run
mkdir -p "$run_dir"

# shellcheck source=scripts/processes.sh
source scripts/processes.sh

step "installing what is missing"
nats_server=$(scripts/install-nats-server.sh)
model_dir=$(scripts/fetch-model.sh)
cargo build --release --locked -p embatch-gateway -p embatch-worker
if [ ! -x .bin/venv/bin/python ]; then
  python3 -m venv .bin/venv
fi
.bin/venv/bin/pip show nats-py >/dev/null 2>&1 || .bin/venv/bin/pip install --quiet --disable-pip-version-check 'nats-py==2.16.0'

# Gateway and worker first (they drain and flush through NATS), nats-server last.
trap stop_started EXIT

step "starting nats-server :$nats_port (JetStream), a worker (built-in model) and the gateway :$gateway_port (logs in $run_dir/)"
# nats/nats.conf as compose runs it, with JetStream's store moved from /data (the compose volume)
# into $run_dir: the jetstream block is restated here, because nats-server refuses a store_dir
# given both in the file and with -sd.
cat >"$run_dir/nats.conf" <<EOF
include "../nats/nats.conf"
jetstream { store_dir: "$PWD/$run_dir/nats-store", max_memory_store: 256MB, max_file_store: 10GB }
EOF
"$nats_server" -c "$run_dir/nats.conf" -p "$nats_port" >"$run_dir/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null; then break; fi
  sleep 0.1
done
NATS_URL="nats://127.0.0.1:$nats_port" MODEL_DIR="$model_dir" METRICS_ADDR="127.0.0.1:$metrics_port" \
  target/release/embatch-worker >"$run_dir/worker.log" 2>&1 &
pids+=($!)
NATS_URL="nats://127.0.0.1:$nats_port" LISTEN_ADDR="127.0.0.1:$gateway_port" \
  target/release/embatch-gateway >"$run_dir/gateway.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$gateway_port/health" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$gateway_port/health" >/dev/null || {
  echo "the stack did not become healthy; see $run_dir/*.log" >&2
  tail -n 20 "$run_dir"/*.log >&2
  exit 1
}

step "POST http://127.0.0.1:$gateway_port/embed (TEI's API)"
body='{"inputs": ["embatch batches many small embedding requests into few full ones.", "A man is playing a guitar on the street corner.", "Someone plays an instrument outside."]}'
echo "$body" >&2
curl -fsS -D "$run_dir/headers.txt" "http://127.0.0.1:$gateway_port/embed" -H 'content-type: application/json' -d "$body" \
  | python3 -c '
import json, sys
texts = json.loads(sys.argv[1])["inputs"]
vectors = json.load(sys.stdin)
for text, v in zip(texts, vectors):
    print(f"[http] {len(v)} dims  [{v[0]:+.4f}, {v[1]:+.4f}, {v[2]:+.4f}, {v[3]:+.4f}, ...]  {text}")
dot = sum(a * b for a, b in zip(vectors[1], vectors[2]))
print(f"cosine(guitar on the street, instrument outside) = {dot:.3f}")
' "$body"
grep -i '^x-' "$run_dir/headers.txt" >&2 || true

step "the same contract over NATS directly, from Python (examples/direct_nats.py)"
.bin/venv/bin/python examples/direct_nats.py "nats://127.0.0.1:$nats_port"

if $keep; then
  step "stack running: gateway http://127.0.0.1:$gateway_port, worker metrics http://127.0.0.1:$metrics_port/metrics; Ctrl-C to stop"
  wait
fi
