#!/usr/bin/env bash
# A worker on a real OpenAI-compatible server (LiteLLM's proxy, from PyPI) against the built-in
# model, outside CI (the proxy's install is ~116 packages). The chain:
#   gateway B :18082 -> worker B (OPENAI_URL=LiteLLM, key) -> LiteLLM :14000
#     -> gateway A :18081 /v1/embeddings -> worker A (built-in all-MiniLM-L6-v2)
# so worker B's vectors must equal worker A's (loadtest/openai_compare.py checks them).
# LiteLLM does not compute embeddings itself: this checks the OpenAI client against a real
# server's request and reply shapes, auth and errors, not a second model implementation
# (docs/design/upstreams.md says why no such server was installed).
#
# Usage: loadtest/openai_litellm.sh   (builds nothing: target/debug/embatch-{worker,gateway})
# Environment: VENV (default /tmp/litellm-venv, created with `pip install 'litellm[proxy]'`
# when absent), NATS_SERVER_BIN as for the tests.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-/tmp/litellm-venv}
nats_server=${NATS_SERVER_BIN:-$("$repo/scripts/install-nats-server.sh")}
bin=$repo/target/debug
[[ -x $venv/bin/litellm ]] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q 'litellm[proxy]'; }
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
start() { local log=$1; shift; "$@" >"$tmp/$log.log" 2>&1 & pids+=($!); }

start natsA "$nats_server" -a 127.0.0.1 -p 14222
start natsB "$nats_server" -a 127.0.0.1 -p 14223
sleep 0.5
common=(METRICS_ADDR= BULK=false CACHE=false)
start workerA env "${common[@]}" NATS_URL=nats://127.0.0.1:14222 \
  MODEL_DIR="$repo/models/all-MiniLM-L6-v2" "$bin/embatch-worker"
start gatewayA env NATS_URL=nats://127.0.0.1:14222 LISTEN_ADDR=127.0.0.1:18081 \
  "$bin/embatch-gateway"
cat >"$tmp/litellm.yaml" <<'YAML'
model_list:
  - model_name: minilm
    litellm_params:
      model: openai/all-MiniLM-L6-v2
      api_base: http://127.0.0.1:18081/v1
      api_key: none
general_settings:
  master_key: sk-embatch-test
YAML
start litellm env LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False \
  "$venv/bin/litellm" --config "$tmp/litellm.yaml" --host 127.0.0.1 --port 14000
for _ in $(seq 120); do
  curl -sf -H 'Authorization: Bearer sk-embatch-test' 127.0.0.1:14000/v1/models >/dev/null && break
  sleep 0.5
done
start workerB env "${common[@]}" NATS_URL=nats://127.0.0.1:14223 \
  OPENAI_URL=http://127.0.0.1:14000/v1 OPENAI_MODEL=minilm OPENAI_API_KEY=sk-embatch-test \
  "$bin/embatch-worker"
start gatewayB env NATS_URL=nats://127.0.0.1:14223 LISTEN_ADDR=127.0.0.1:18082 \
  "$bin/embatch-gateway"
for _ in $(seq 60); do curl -sf 127.0.0.1:18082/v1/models | grep -q minilm && break; sleep 0.5; done
python3 "$repo/loadtest/openai_compare.py" 18082 18081
echo "LiteLLM calls: $(grep -c 'POST /v1/embeddings' "$tmp/litellm.log")"
