#!/usr/bin/env bash
# Real clients against a real stack: starts nats-server, one worker on the built-in model and the
# gateway (debug builds, free loopback ports), then calls them through unmodified, pinned client
# libraries and the examples of docs/nats-contract.md:
#   - Python with API keys (tests/clients/test_tenants.py) against a second gateway that reads
#     tests/clients/tenants.toml: openai's api_key and huggingface_hub's token, and their 401s;
#   - Python (tests/clients/test_clients.py, pins in tests/clients/requirements.txt, venv in
#     ${XDG_CACHE_HOME:-~/.cache}/embatch/client-venv): huggingface_hub, openai (base64 and float,
#     and a bulk job through files + batches, tests/clients/openai_batch.py), llama-index's TEI
#     embeddings, nats-py; every vector is compared with testdata's TEI reference (the bulk job's
#     also with what /v1/embeddings answers for the same input); cohere's rerank (v2 and v1)
#     against a second worker, model `tei-double-reranker`, on the TEI double as a reranker
#     (`embatch-loadtest fake-upstream --reranker`), its scores compared with POST /rerank's;
#     cohere's embed (v2 with float, int8 and ubinary types; v1's floats) and openai with
#     `output_dtype` (compact vectors), each checked against the documented quantization;
#   - a framework's reranker (tests/clients/framework_rerank.py, LlamaIndex's CohereRerank, in a
#     venv of its own from tests/clients/requirements-frameworks.txt: it needs cohere < 7);
#   - examples/direct_nats.py, examples/go (nats.go), examples/node (nats on npm), run as written:
#     one vector of 384 floats on `embed`, and exit 3 (not a crash) on a subject nobody serves;
#   - their acknowledgement-and-resend versions (examples/direct_nats_resend.py,
#     examples/go/resend, examples/node/resend.mjs), the same two checks, and four through a
#     relay that loses the first copy of each request (tests/clients/lossy_relay.py): dropped,
#     acknowledged by a worker that then dies (no heartbeat), acknowledged by one that
#     reconnected (its heartbeat's connect count rises), and answered 503 by a worker whose
#     upstream died: each time the example resends it (Embatch-Attempt: 2), gets its vector,
#     then withdraws the id on `.cancel`;
#   - schemathesis (pinned in the same requirements.txt) fuzzes every operation of the gateway's
#     own GET /openapi.json (ST_MAX_EXAMPLES per operation, 40 by default, plus its coverage
#     cases): no 5xx, only documented statuses, documented content types, headers and bodies.
#     It prints its seed; ST_SEED=<seed> replays the same generated requests;
#   - loadtest/kvcost (nats.go, docs/design/cache.md) builds and measures 300 puts on its own
#     nats-server.
# Stops everything it started on exit. Exits non-zero when any check fails.
#
# Usage: scripts/client-tests.sh        (scripts/test.sh runs it after cargo test)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$SECONDS

# shellcheck source=scripts/processes.sh
source scripts/processes.sh
use_tmp

step "building the gateway and the worker (debug; a no-op after cargo test)"
nats_server=$(scripts/install-nats-server.sh)
model_dir=$(scripts/fetch-model.sh)
cargo build --locked -p embatch-gateway -p embatch-worker -p embatch-loadtest
bin_dir=${CARGO_TARGET_DIR:-target}/debug

step "installing the clients: Python venv, Go module, npm package"
venv=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/embatch/client-venv
if ! cmp -s tests/clients/requirements.txt "$venv/requirements.installed"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
  cp tests/clients/requirements.txt "$venv/requirements.installed"
fi
# A framework's reranker needs an older cohere than the SDK checks: a venv of its own.
frameworks=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/embatch/client-venv-frameworks
if ! cmp -s tests/clients/requirements-frameworks.txt "$frameworks/requirements.installed"; then
  rm -rf "$frameworks"
  python3 -m venv "$frameworks"
  "$frameworks/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements-frameworks.txt
  cp tests/clients/requirements-frameworks.txt "$frameworks/requirements.installed"
fi
(cd examples/go && go build -o "$tmp/go-example" . && go build -o "$tmp/go-resend-example" ./resend)
(cd loadtest/kvcost && go build -o "$tmp/kvcost" .)
(cd examples/node && npm ci --no-audit --no-fund --loglevel=error >"$tmp/npm.log" 2>&1) || {
  cat "$tmp/npm.log" >&2
  exit 1
}

step "loadtest/kvcost: nats-server's CPU per KV put"
"$tmp/kvcost" "$nats_server" 300 4400 seq | tee "$tmp/kvcost.out"
grep -Eq 'mode=seq .*puts=300 .*server-cpu/put=[0-9.]+us' "$tmp/kvcost.out"

nats_port=$(free_port)
gateway_port=$(free_port)
nats_url="nats://127.0.0.1:$nats_port"
gateway="http://127.0.0.1:$gateway_port"
step "starting nats-server $nats_url (JetStream, store in $tmp), a worker (built-in model) and the gateway $gateway"
"$nats_server" -a 127.0.0.1 -p "$nats_port" -js -sd "$tmp/nats-store" >"$tmp/nats.log" 2>&1 &
pids+=($!)
poll 10 listening "$nats_port" || true
"$bin_dir/embatch-worker" --nats-url "$nats_url" --model-dir "$model_dir" --metrics-addr "" >"$tmp/worker.log" 2>&1 &
pids+=($!)
"$bin_dir/embatch-gateway" --nats-url "$nats_url" --listen "127.0.0.1:$gateway_port" >"$tmp/gateway.log" 2>&1 &
pids+=($!)
# A second gateway on the same NATS, with tenants (tests/clients/test_tenants.py).
keyed_port=$(free_port)
keyed_gateway="http://127.0.0.1:$keyed_port"
"$bin_dir/embatch-gateway" --nats-url "$nats_url" --listen "127.0.0.1:$keyed_port" \
  --tenants-file tests/clients/tenants.toml >"$tmp/gateway-tenants.log" 2>&1 &
pids+=($!)
poll 60 curl -fsS "$gateway/health" || {
  echo "the stack did not become healthy (a process exited, or 60 s passed)" >&2
  show_logs
  exit 1
}

# A reranker beside it (tests/clients/test_clients.py's cohere checks): the TEI double as a
# reranker, and a worker of model `tei-double-reranker` that leaves the plain subject to MiniLM.
minilm=$(curl -fsS "$gateway/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
reranker_port=$(free_port)
"$bin_dir/embatch-loadtest" fake-upstream --listen "127.0.0.1:$reranker_port" --reranker \
  --base-ms 1 >"$tmp/reranker-tei.log" 2>&1 &
pids+=($!)
"$bin_dir/embatch-worker" --nats-url "$nats_url" --tei-url "http://127.0.0.1:$reranker_port" \
  --model-alias tei-double-reranker --default-model "$minilm" --metrics-addr "" \
  >"$tmp/reranker-worker.log" 2>&1 &
pids+=($!)
poll 30 curl -fsS "$gateway/models/tei-double-reranker/health" || {
  echo "the reranker worker did not become healthy" >&2
  show_logs
  exit 1
}

results=()
record() { # record PASS|FAIL label
  results+=("$1  $2")
  printf '%s  %s\n' "$1" "$2" >&2
}

# suite OUT SCRIPT DIR CMD...: runs CMD in DIR, a client suite printing "PASS  label" and
# "FAIL  label — why" lines (also kept in "$tmp/OUT.out"); its lines become results, and an exit
# other than 0 with no FAIL line (a crash before or between tests) is recorded as SCRIPT's FAIL.
suite() {
  local out="$tmp/$1.out" script=$2 dir=$3 status
  shift 3
  set +e
  (cd "$dir" && "$@") 2>&1 | tee "$out"
  status=${PIPESTATUS[0]}
  set -e
  while IFS= read -r line; do results+=("$line"); done < <(grep -E '^(PASS|FAIL)  ' "$out" | sed 's/ — .*//')
  if [ "$status" -ne 0 ] && ! grep -q '^FAIL  ' "$out"; then
    record FAIL "$script exited $status"
  fi
}

step "Python client libraries against the gateway and NATS (vectors vs testdata's TEI reference)"
suite python tests/clients/test_clients.py . \
  "$venv/bin/python" tests/clients/test_clients.py "$gateway" "$nats_url"

step "A framework's reranker against the gateway (LlamaIndex's CohereRerank)"
suite frameworks tests/clients/framework_rerank.py tests/clients \
  "$frameworks/bin/python" framework_rerank.py "$gateway"

step "Python client libraries against the gateway with tenants (API keys, 401s)"
suite tenants tests/clients/test_tenants.py tests/clients \
  env -u HF_TOKEN "$venv/bin/python" test_tenants.py "$keyed_gateway"

# expect_vector LABEL CMD...: the example embeds one text: exit 0, one line "[nats] 384 dims ...".
expect_vector() {
  local label=$1 status=0
  shift
  "$@" "$nats_url" "What is vector search?" >"$tmp/out" 2>&1 || status=$?
  cat "$tmp/out" >&2
  if [ "$status" -eq 0 ] && [ "$(grep -c '^\[nats\] 384 dims ' "$tmp/out")" -eq 1 ] && [ "$(wc -l <"$tmp/out")" -eq 1 ]; then
    record PASS "$label: one vector of 384 floats"
  else
    record FAIL "$label: want exit 0 and one vector of 384 floats, got exit $status"
  fi
}
# expect_no_responders LABEL CMD...: on a subject nobody serves, exit 3 with its message, no crash.
expect_no_responders() {
  local label=$1 status=0
  shift
  EMBATCH_SUBJECT=embatch-client-tests.nobody-serves-this "$@" "$nats_url" "x" >"$tmp/out" 2>&1 || status=$?
  cat "$tmp/out" >&2
  if [ "$status" -eq 3 ] && grep -q 'no embatch worker is listening' "$tmp/out"; then
    record PASS "$label: no responders handled (exit 3)"
  else
    record FAIL "$label: want exit 3 and 'no embatch worker is listening' on no responders, got exit $status"
  fi
}

# expect_resend HOW LABEL CMD...: through lossy_relay.py, which loses the first copy as HOW says
# (drop, silent, reconnect, unhealthy), the example resends (copy 2, same request id), prints one
# vector, and withdraws the id on `.cancel` after.
expect_resend() {
  local how=$1 label="$2 (first copy: $1)" status=0 from id
  shift 2
  from=$(($(wc -l <"$tmp/relay.log") + 1))
  EMBATCH_SUBJECT=$relay_prefix.$how "$@" "$nats_url" "What is vector search?" >"$tmp/out" 2>&1 || status=$?
  cat "$tmp/out" >&2
  id=$(tail -n "+$from" "$tmp/relay.log" | sed -n "s/^$how \([^ ]*\) attempt 1\$/\1/p" | head -n 1)
  for _ in $(seq 1 20); do # the withdrawal may reach the relay just after the example exits
    if tail -n "+$from" "$tmp/relay.log" | grep -qxF "cancel $id"; then break; fi
    sleep 0.1
  done
  tail -n "+$from" "$tmp/relay.log" | sed 's/^/  relay: /' >&2
  if [ "$status" -eq 0 ] && [ "$(grep -c '^\[nats\] 384 dims ' "$tmp/out")" -eq 1 ] && [ -n "$id" ] &&
    tail -n "+$from" "$tmp/relay.log" | grep -qxF "forwarded $id attempt 2" &&
    tail -n "+$from" "$tmp/relay.log" | grep -qxF "cancel $id"; then
    record PASS "$label: first copy lost, resent as attempt 2, one vector, then withdrawn"
  else
    record FAIL "$label: want the lost first copy resent as attempt 2, one vector and a withdrawal, got exit $status"
  fi
}

step "the examples of docs/nats-contract.md on the NATS subject"
nats_py=$("$venv/bin/pip" show nats-py | sed -n 's/^Version: //p')
nats_go=$(sed -n 's|^require github.com/nats-io/nats.go ||p' examples/go/go.mod)
nats_js=$(node -p 'require("./examples/node/node_modules/nats/package.json").version')
expect_vector "examples/direct_nats.py (nats-py $nats_py)" "$venv/bin/python" examples/direct_nats.py
expect_no_responders "examples/direct_nats.py (nats-py $nats_py)" "$venv/bin/python" examples/direct_nats.py
expect_vector "examples/go (nats.go $nats_go, $(go env GOVERSION))" "$tmp/go-example"
expect_no_responders "examples/go (nats.go $nats_go)" "$tmp/go-example"
expect_vector "examples/node (nats $nats_js, node $(node --version))" node examples/node/index.mjs
expect_no_responders "examples/node (nats $nats_js)" node examples/node/index.mjs

step "the acknowledgement-and-resend examples of docs/design/recovery.md, also through a lossy relay"
relay_prefix=embatch-client-tests.lossy
losses=(drop silent reconnect unhealthy) # the ways lossy_relay.py loses a first copy
"$venv/bin/python" tests/clients/lossy_relay.py "$nats_url" "$relay_prefix" embed >"$tmp/relay.log" 2>&1 &
pids+=($!)
poll 10 grep -qx ready "$tmp/relay.log" || true
resend_py="examples/direct_nats_resend.py (nats-py $nats_py)"
expect_vector "$resend_py" "$venv/bin/python" examples/direct_nats_resend.py
expect_no_responders "$resend_py" "$venv/bin/python" examples/direct_nats_resend.py
for how in "${losses[@]}"; do expect_resend "$how" "$resend_py" "$venv/bin/python" examples/direct_nats_resend.py; done
expect_vector "examples/go/resend (nats.go $nats_go)" "$tmp/go-resend-example"
expect_no_responders "examples/go/resend (nats.go $nats_go)" "$tmp/go-resend-example"
for how in "${losses[@]}"; do expect_resend "$how" "examples/go/resend (nats.go $nats_go)" "$tmp/go-resend-example"; done
expect_vector "examples/node/resend.mjs (nats $nats_js)" node examples/node/resend.mjs
expect_no_responders "examples/node/resend.mjs (nats $nats_js)" node examples/node/resend.mjs
for how in "${losses[@]}"; do expect_resend "$how" "examples/node/resend.mjs (nats $nats_js)" node examples/node/resend.mjs; done

# Last, so its load cannot disturb the checks above. tests/clients/schemathesis_hooks.py raises a
# valid `x-embatch-timeout-ms` to 60 s: with a few ms, 504 is the right answer, not a defect.
step "schemathesis: every operation of the gateway's /openapi.json, fuzzed against the gateway"
st_version=$("$venv/bin/pip" show schemathesis | sed -n 's/^Version: //p')
st_started=$SECONDS
st_status=0
# Run in $tmp: schemathesis and hypothesis write caches (.schemathesis/, .hypothesis/) into the
# working directory.
st_hooks=$PWD/tests/clients/schemathesis_hooks.py
(cd "$tmp" && SCHEMATHESIS_HOOKS=$st_hooks "$venv/bin/st" run "$gateway/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "${ST_MAX_EXAMPLES:-40}" ${ST_SEED:+--seed "$ST_SEED"} --workers 1 \
  --generation-database none --no-color) >"$tmp/schemathesis.out" 2>&1 || st_status=$?
cat "$tmp/schemathesis.out" >&2
st_operations=$(sed -n 's/^ *Tested: *\([0-9]*\).*/\1/p' "$tmp/schemathesis.out" | tail -n 1)
st_cases=$(sed -n 's/^ *\([0-9]* generated, .*\)$/\1/p' "$tmp/schemathesis.out" | tail -n 1)
st_label="schemathesis $st_version: ${st_operations:-?} operations, ${st_cases:-no test cases} ($((SECONDS - st_started))s)"
if [ "$st_status" -eq 0 ]; then
  record PASS "$st_label"
else
  record FAIL "$st_label, exit $st_status (failures above)"
fi

passed=0 failed=0
printf '\n==> client tests (%ss)\n' "$((SECONDS - started))"
for r in "${results[@]}"; do
  echo "$r"
  case $r in PASS*) passed=$((passed + 1)) ;; *) failed=$((failed + 1)) ;; esac
done
echo "client-tests: $passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
  show_logs
  exit 1
fi
