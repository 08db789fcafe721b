#!/usr/bin/env bash
# Installs the tools scripts/deploy-check.sh needs into <repo>/.bin (ignored by git), unless the
# pinned version is already there:
#   helm         helm.sh/helm/v3, built from the Go module proxy (go install)
#   kubeconform  github.com/yannh/kubeconform, likewise
#   promtool     Debian's `prometheus` package, unpacked (apt-get download + dpkg-deb -x): only
#                the promtool binary is kept; nothing is installed system-wide
# Needs Go >= 1.22, apt-get and dpkg-deb. Idempotent: a second run with everything in place does
# nothing. Building helm and kubeconform with an empty Go module cache takes a few minutes.
#
# Usage: scripts/install-deploy-tools.sh      Prints the directory holding the three tools.
set -euo pipefail

helm_version="v3.22.0"
kubeconform_version="v0.8.0"
# promtool 2.x from Debian bookworm (2.42); `promtool test rules` is all the check needs.
promtool_min_major=2

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir="$repo_root/.bin"
mkdir -p "$bin_dir"

need_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "error: $1 is missing and Go is not installed to build it (apt-get install golang)" >&2
    exit 1
  fi
}

# go_tool NAME MODULE VERSION: builds MODULE@VERSION into .bin unless the binary there was built
# from that module version (its build information, `go version -m`; the binaries themselves
# report no exact version when built by go install).
go_tool() {
  local name=$1 module=$2 version=$3
  if [ -x "$bin_dir/$name" ]; then
    if ! command -v go >/dev/null 2>&1; then
      return # cannot tell its version: keep it
    fi
    if go version -m "$bin_dir/$name" 2>/dev/null | awk '$1 == "mod" { print $3 }' | grep -qxF -- "$version"; then
      return
    fi
  fi
  need_go "$name"
  echo "installing $name $version into $bin_dir (go install)" >&2
  GOBIN="$bin_dir" GOFLAGS=-mod=mod go install -trimpath -ldflags="-s -w" "$module@$version" >&2
}

go_tool helm helm.sh/helm/v3/cmd/helm "$helm_version"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$kubeconform_version"

promtool_ok() {
  [ -x "$bin_dir/promtool" ] || return 1
  local major
  major=$("$bin_dir/promtool" --version 2>&1 | sed -n 's/^promtool, version \([0-9]*\)\..*/\1/p')
  [ -n "$major" ] && [ "$major" -ge "$promtool_min_major" ]
}

if ! promtool_ok; then
  for tool in apt-get dpkg-deb; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "error: promtool is missing and $tool is not there to fetch it (install Prometheus' promtool into $bin_dir)" >&2
      exit 1
    }
  done
  echo "installing promtool into $bin_dir (Debian package prometheus, unpacked)" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download needs the package lists; fetch them once if they are missing.
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    apt-get update -qq >&2
    (cd "$work" && apt-get download prometheus >&2)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  install -m 0755 "$work/root/usr/bin/promtool" "$bin_dir/promtool"
  promtool_ok || { echo "error: the unpacked promtool does not run" >&2; exit 1; }
fi

echo "$bin_dir"
