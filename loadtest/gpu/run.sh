#!/usr/bin/env bash
# The GPU table, on the machine with the GPU: unpacks what loadtest/gpu/pack.sh put in .gpu/
# (release binaries of the gateway, the worker, the load generator and nats-server; the
# all-MiniLM-L6-v2 directory in float16) and runs loadtest/gpu/bench.py, which writes gpu.json,
# gpu.md and logs.tar.gz into $OUT. Needs python3 with torch, transformers and tokenizers.
#
# Usage: OUT=DIR loadtest/gpu/run.sh [bench.py options, e.g. --device cpu --duration 3]
# Environment: GPU_PACK (default .gpu), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pack=${GPU_PACK:-.gpu}
out=${OUT:?set OUT to the output directory}
python=${PYTHON:-python3}
bin=$(mktemp -d /tmp/embatch-gpu-bin.XXXXXX)
trap 'rm -rf "$bin"' EXIT
mkdir -p "$out"
# Python's tarfile, not tar -J: the machine may lack xz.
"$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack/bin.tar.xz" "$bin"
nvidia-smi 2>/dev/null | head -15 || true
"$python" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
set -o pipefail
PYTHONUNBUFFERED=1 "$python" loadtest/gpu/bench.py --bin-dir "$bin" --model-dir "$pack/model" --out "$out" \
  --python "$python" "$@" 2>&1 | tee "$out/bench.log"
