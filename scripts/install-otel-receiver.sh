#!/usr/bin/env bash
# Installs the OTLP receiver of the tracing check (scripts/trace-check.sh): Jaeger v2, built from
# Go modules (the module tests/trace/jaeger pins it and everything it builds with), into
# <repo>/.bin/jaeger, unless a binary of the pinned release is already there, in
# $OTEL_RECEIVER_BIN or in the per-user cache ${XDG_CACHE_HOME:-~/.cache}/embatch/, which a fresh
# clone on the same machine reuses (the first build takes several minutes on 2 cores: about 800
# modules). A candidate built from another Jaeger release is passed over, with a note on stderr.
#
# Usage: scripts/install-otel-receiver.sh      Prints the binary's path on stdout.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir="$repo_root/.bin"
module_dir="$repo_root/tests/trace/jaeger"
version=v1.76.0 # also in tests/trace/jaeger/go.mod
cache_dir=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/embatch
cached="$cache_dir/jaeger-$version"

if ! command -v go >/dev/null 2>&1; then
  echo "error: the OTLP receiver (Jaeger $version) is built with Go, which is not installed (apt-get install golang)" >&2
  exit 1
fi

# built_from VERSION BINARY: the binary's build info names Jaeger at VERSION.
built_from() { go version -m "$2" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/jaegertracing/jaeger[[:space:]]+$1[[:space:]]"; }

for candidate in "${OTEL_RECEIVER_BIN:-}" "$bin_dir/jaeger" "$cached"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then
    if built_from "$version" "$candidate"; then
      if [ "$candidate" = "$cached" ]; then
        mkdir -p "$bin_dir"
        cp "$cached" "$bin_dir/jaeger"
        candidate="$bin_dir/jaeger"
      fi
      echo "$candidate"
      exit 0
    fi
    echo "note: passing over $candidate (not built from Jaeger $version)" >&2
  fi
done

echo "installing Jaeger $version into $bin_dir (go build of tests/trace/jaeger; minutes the first time)" >&2
mkdir -p "$bin_dir" "$cache_dir"
start=$SECONDS
go build -C "$module_dir" -trimpath -o "$bin_dir/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger >&2
if ! built_from "$version" "$bin_dir/jaeger"; then
  echo "error: $bin_dir/jaeger is not built from Jaeger $version after go build" >&2
  exit 1
fi
cp "$bin_dir/jaeger" "$cached.tmp" && mv "$cached.tmp" "$cached"
echo "built Jaeger $version in $((SECONDS - start)) s" >&2
echo "$bin_dir/jaeger"
