#!/usr/bin/env bash
# Installs nats-server (pinned) into <repo>/.bin unless one is already there, on PATH or in
# $HOME/go/bin. Builds it from the Go module proxy with `go install`; needs Go ≥ 1.22.
#
# Usage: scripts/install-nats-server.sh      Prints the binary's path on stdout.
set -euo pipefail

version="v2.10.22"
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir="$repo_root/.bin"

for candidate in "${NATS_SERVER_BIN:-}" "$bin_dir/nats-server" "$(command -v nats-server 2>/dev/null || true)" "$HOME/go/bin/nats-server"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then
    echo "$candidate"
    exit 0
  fi
done

if ! command -v go >/dev/null 2>&1; then
  echo "error: nats-server is missing and Go is not installed to build it (apt-get install golang, or install nats-server from your package manager)" >&2
  exit 1
fi
echo "installing nats-server $version into $bin_dir (go install)" >&2
mkdir -p "$bin_dir"
GOBIN="$bin_dir" GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@$version" >&2
echo "$bin_dir/nats-server"
