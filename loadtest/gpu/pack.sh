#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored through .git/info/exclude) for loadtest/gpu/run.sh on a machine
# without Rust or network: stripped release binaries of embatch-gateway, embatch-worker,
# embatch-loadtest and nats-server in bin.tar.xz (with BUILD_COMMIT), and all-MiniLM-L6-v2 with
# its weights converted to float16 safetensors (about 45 MB instead of 90 MB).
#
# Usage: loadtest/gpu/pack.sh RELEASE_DIR BUILD_COMMIT
#   RELEASE_DIR holds the three release binaries, e.g. from
#   CARGO_TARGET_DIR=/tmp/gpu-target cargo build --release --locked -p embatch-gateway \
#     -p embatch-worker -p embatch-loadtest   (then /tmp/gpu-target/release)
# Environment: PYTHON (default python3) with numpy and safetensors.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
release=${1:?RELEASE_DIR}
commit=${2:?BUILD_COMMIT}
python=${PYTHON:-python3}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu && mkdir -p .gpu/model/1_Pooling
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for b in embatch-gateway embatch-worker embatch-loadtest; do
  strip -o "$stage/$b" "$release/$b"
done
strip -o "$stage/nats-server" "$(scripts/install-nats-server.sh)"
echo "$commit" >"$stage/BUILD_COMMIT"
tar -C "$stage" -cf - . | xz -9e -T2 >.gpu/bin.tar.xz
model=$(scripts/fetch-model.sh)
for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json \
  sentence_bert_config.json modules.json config_sentence_transformers.json 1_Pooling/config.json; do
  cp "$model/$f" ".gpu/model/$f"
done
"$python" - "$model/model.safetensors" .gpu/model/model.safetensors <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
tensors = load_file(sys.argv[1])
save_file({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in tensors.items()},
          sys.argv[2], metadata={"format": "pt"})
PY
du -sh .gpu/bin.tar.xz .gpu/model
