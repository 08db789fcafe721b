#!/usr/bin/env bash
# The tracing check: a real OTLP receiver gets one request's trace, with the gateway, worker and
# upstream-call spans linked (docs/observability.md#tracing). Starts Jaeger v2 (built from Go
# modules by scripts/install-otel-receiver.sh; OTLP in, traces in memory, every port a free
# loopback one), nats-server, a stand-in TEI that logs the traceparent of each call
# (tests/trace/fake_tei.py), a worker exporting over OTLP/gRPC and a gateway exporting over
# OTLP/HTTP (debug builds), sends one POST /embed carrying a W3C traceparent, and asserts through
# Jaeger's query API that the trace holds every span, parented and linked as designed, and that
# TEI got the upstream call's own traceparent (tests/trace/check_trace.py).
# Stops everything it started on exit. Exits non-zero when any check fails.
#
# Usage: scripts/trace-check.sh        (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/processes.sh
source scripts/processes.sh
use_tmp
wait_for() { # wait_for WHAT CMD...: up to 60 s, while every started process lives
  local what=$1
  shift
  poll 60 "$@" && return 0
  echo "$what did not come up (a process exited, or 60 s passed)" >&2
  show_logs
  exit 1
}

step "installing the OTLP receiver (Jaeger v2) and nats-server; building the gateway and the worker (debug)"
jaeger=$(scripts/install-otel-receiver.sh)
nats_server=$(scripts/install-nats-server.sh)
cargo build --locked -p embatch-gateway -p embatch-worker
bin_dir=${CARGO_TARGET_DIR:-target}/debug

export TRACE_QUERY_PORT TRACE_QUERY_GRPC_PORT TRACE_HEALTH_PORT TRACE_OTLP_GRPC_PORT TRACE_OTLP_HTTP_PORT
TRACE_QUERY_PORT=$(free_port)
TRACE_QUERY_GRPC_PORT=$(free_port)
TRACE_HEALTH_PORT=$(free_port)
TRACE_OTLP_GRPC_PORT=$(free_port)
TRACE_OTLP_HTTP_PORT=$(free_port)
query="http://127.0.0.1:$TRACE_QUERY_PORT"
step "starting Jaeger (OTLP gRPC :$TRACE_OTLP_GRPC_PORT, HTTP :$TRACE_OTLP_HTTP_PORT, query $query)"
"$jaeger" --config "file:tests/trace/jaeger.yaml" >"$tmp/jaeger.log" 2>&1 &
pids+=($!)
wait_for "Jaeger" curl -fsS "http://127.0.0.1:$TRACE_HEALTH_PORT/status"

nats_port=$(free_port)
nats_url="nats://127.0.0.1:$nats_port"
gateway_port=$(free_port)
gateway="http://127.0.0.1:$gateway_port"
step "starting nats-server $nats_url, the stand-in TEI, a worker (OTLP/gRPC) and the gateway $gateway (OTLP/HTTP)"
"$nats_server" -a 127.0.0.1 -p "$nats_port" -js -sd "$tmp/nats-store" >"$tmp/nats.log" 2>&1 &
pids+=($!)
wait_for "nats-server" bash -c "exec 3<>/dev/tcp/127.0.0.1/$nats_port"
python3 tests/trace/fake_tei.py "$tmp/tei.port" "$tmp/tei-calls.jsonl" >"$tmp/tei.log" 2>&1 &
pids+=($!)
wait_for "the stand-in TEI" test -s "$tmp/tei.port"
touch "$tmp/tei-calls.jsonl"
# Spans leave in batches every 200 ms instead of 5 s, so the check waits less.
export OTEL_BSP_SCHEDULE_DELAY=200
HF_HUB_OFFLINE=1 OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$TRACE_OTLP_GRPC_PORT" OTEL_EXPORTER_OTLP_PROTOCOL=grpc \
  "$bin_dir/embatch-worker" --nats-url "$nats_url" --tei-url "http://127.0.0.1:$(cat "$tmp/tei.port")" \
  --metrics-addr "" >"$tmp/worker.log" 2>&1 &
pids+=($!)
"$bin_dir/embatch-gateway" --nats-url "$nats_url" --listen "127.0.0.1:$gateway_port" \
  --otlp-endpoint "http://127.0.0.1:$TRACE_OTLP_HTTP_PORT" --otlp-protocol http/protobuf >"$tmp/gateway.log" 2>&1 &
pids+=($!)
wait_for "the stack" curl -fsS "$gateway/health"

trace_id=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
caller_span=$(python3 -c 'import secrets; print(secrets.token_hex(8))')
step "POST /embed with traceparent 00-$trace_id-$caller_span-01"
curl -fsS "$gateway/embed" -H 'Content-Type: application/json' \
  -H "traceparent: 00-$trace_id-$caller_span-01" -H 'tracestate: embatch=trace-check' \
  -d '{"inputs": ["one request, one trace"]}' >"$tmp/reply.json"
echo "reply: $(cat "$tmp/reply.json")" >&2

step "the trace in Jaeger ($query/api/v3/traces/$trace_id)"
if ! python3 tests/trace/check_trace.py "$query" "$trace_id" "$caller_span" "$tmp/tei-calls.jsonl"; then
  show_logs
  exit 1
fi
