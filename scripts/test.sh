#!/usr/bin/env bash
# The whole test suite: installs what the tests need (nats-server, the three models' weights: MiniLM,
# bge-small and a tiny SPLADE model), then runs
# every test of the workspace, the real client libraries (scripts/client-tests.sh) and the tracing
# check against a real OTLP receiver (scripts/trace-check.sh, which builds Jaeger the first time).
# Tests start their own nats-server on free ports.
#
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 scripts/checks/sizes.py # files <= 500 lines, fns <= 80; before the slow steps, to fail fast

export NATS_SERVER_BIN
NATS_SERVER_BIN=$(scripts/install-nats-server.sh)
export EMBATCH_MODEL_DIR
EMBATCH_MODEL_DIR=$(scripts/fetch-model.sh)
export EMBATCH_BGE_MODEL_DIR
EMBATCH_BGE_MODEL_DIR=$(scripts/fetch-model.sh --model bge-small-en-v1.5)
export EMBATCH_SPLADE_MODEL_DIR
EMBATCH_SPLADE_MODEL_DIR=$(scripts/fetch-model.sh --model splade-tiny)

cargo test --workspace --locked --no-fail-fast "$@"
scripts/client-tests.sh
scripts/trace-check.sh
