#!/usr/bin/env bash
# Installs the pinned nats-server into <repo>/.bin unless one of that exact version is already
# there, in $NATS_SERVER_BIN, on PATH or in $HOME/go/bin. The version is the one in nats/VERSION
# (the project's only pin of it; nats/README.md). A candidate whose `nats-server --version` reports
# another version is passed over, with a note on stderr. Builds with `go install` from the Go
# module proxy; needs the Go that release's go.mod names (1.26 for v2.15).
#
# Usage: scripts/install-nats-server.sh      Prints the binary's path on stdout.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir="$repo_root/.bin"
version=$(tr -d '[:space:]' <"$repo_root/nats/VERSION")
if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "error: nats/VERSION must hold one version such as v2.15.2, not '$version'" >&2
  exit 1
fi

# reports VERSION BINARY: `nats-server --version` prints "nats-server: v2.15.2".
reports() { [[ $("$2" --version 2>/dev/null) == "nats-server: $1" ]]; }

for candidate in "${NATS_SERVER_BIN:-}" "$bin_dir/nats-server" "$(command -v nats-server 2>/dev/null || true)" "$HOME/go/bin/nats-server"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then
    if reports "$version" "$candidate"; then
      echo "$candidate"
      exit 0
    fi
    echo "note: passing over $candidate ($("$candidate" --version 2>/dev/null || echo 'no version'); the pin is $version)" >&2
  fi
done

if ! command -v go >/dev/null 2>&1; then
  echo "error: nats-server $version is missing and Go is not installed to build it (apt-get install golang, or install nats-server $version from its releases)" >&2
  exit 1
fi
echo "installing nats-server $version into $bin_dir (go install)" >&2
mkdir -p "$bin_dir"
GOBIN="$bin_dir" GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@$version" >&2
if ! reports "$version" "$bin_dir/nats-server"; then
  echo "error: $bin_dir/nats-server does not report $version after go install" >&2
  exit 1
fi
echo "$bin_dir/nats-server"
