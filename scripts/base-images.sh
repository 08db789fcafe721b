#!/usr/bin/env bash
# Makes the base images that Dockerfile and compose.yaml name available to the local Docker engine:
#
#   debian:bookworm-slim        runtime base of the gateway and worker images
#   rust:1.95-slim-bookworm     the builder stage (RUST_VERSION in Dockerfile)
#   python:3.12-slim-bookworm   the model stage (PYTHON_VERSION in Dockerfile)
#   nats:<minor>-alpine         the nats service of compose.yaml (the minor of nats/VERSION)
#   prom/prometheus:v<ver>      the prometheus service of compose.yaml's observe profile
#
# For each tag: kept if the engine already has it, else pulled, else (no registry reachable, e.g.
# offline or air-gapped) built here as a stand-in under the same tag, from Debian packages and
# what this machine has:
#   debian:bookworm-slim       debootstrap --variant=minbase from the Debian mirror apt uses, with
#                              docs, man pages and locales left out as in the official slim image;
#   rust:<ver>-slim-bookworm   that + ca-certificates gcc libc6-dev + this machine's Rust toolchain
#                              (rustc --print sysroot, which must be <ver>), RUSTUP_HOME, CARGO_HOME
#                              and PATH as in the official image;
#   python:3.12-slim-bookworm  that + a CPython 3.12 from this machine (pyenv, PYTHON312 or
#                              python3.12 on PATH), pip pointed at the system CA bundle;
#   nats:<minor>-alpine        that + a static nats-server of the version in nats/VERSION (go
#                              install, CGO off) + wget for the health check, with the official
#                              entrypoint and config path; a stand-in of another version is rebuilt.
#   prom/prometheus:v<ver>     that + Debian's `prometheus` package, which must be <ver> (bookworm
#                              has 2.42.0, hence compose.yaml's pin) + wget for the health check,
#                              with the official image's entrypoint, user, paths and port.
# Stand-ins carry the label org.embatch.stand-in=true and trust this machine's extra CA
# certificates (/usr/local/share/ca-certificates), so builds behind a TLS-inspecting proxy can
# reach crates.io and PyPI. Each stand-in is reported on stderr as "STAND-IN".
#
# Usage: scripts/base-images.sh [--no-pull]   (needs root for debootstrap; Docker must be running)
# Env: DEBIAN_MIRROR (default: the first deb URI apt is configured with), BASE_PULL_TIMEOUT (s, 60).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/embatch
pull=1
[[ ${1:-} == --no-pull ]] && pull=0

log() { printf 'base-images: %s\n' "$*" >&2; }

rust_version=$(sed -n 's/^ARG RUST_VERSION=//p' "$root/Dockerfile")
python_version=$(sed -n 's/^ARG PYTHON_VERSION=//p' "$root/Dockerfile")
nats_image=$(sed -n 's/^ *image: \(nats:[^ ]*\)$/\1/p' "$root/compose.yaml")
nats_server_version=$(tr -d '[:space:]' <"$root/nats/VERSION")
prometheus_image=$(sed -n 's/^ *image: \(prom\/prometheus:[^ ]*\)$/\1/p' "$root/compose.yaml")
label=org.embatch.stand-in=true

# have TAG: the engine has it. get TAG: have or pull it.
have() { docker image inspect "$1" >/dev/null 2>&1; }
get() {
  have "$1" && { log "$1: present$(is_stand_in "$1" && echo ' (a stand-in built earlier)')"; return 0; }
  ((pull)) || return 1
  log "$1: pulling"
  timeout "${BASE_PULL_TIMEOUT:-60}" docker pull -q "$1" >/dev/null 2>&1 && return 0
  log "$1: cannot be pulled (no registry reachable)"
  return 1
}
is_stand_in() { [[ $(docker image inspect -f '{{index .Config.Labels "org.embatch.stand-in"}}' "$1" 2>/dev/null) == true ]]; }

# The stand-ins' Dockerfiles are plain (no RUN --mount): the classic builder builds them, with no
# need for the buildx plugin that a newer docker CLI wants for BuildKit.
docker_build() { DOCKER_BUILDKIT=0 docker build "$@" 2>"$tmp/build.log" || { tail -n 30 "$tmp/build.log" >&2; return 1; }; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The machine's own CA certificates, for the stand-ins that fetch over TLS.
mkdir -p "$tmp/certs"
cp /usr/local/share/ca-certificates/*.crt "$tmp/certs/" 2>/dev/null || true

debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hoE '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    awk '{print $2}' | grep -v security | head -n 1)
  echo "${uri:-http://deb.debian.org/debian}"
}

build_debian() {
  local tag=debian:bookworm-slim dir=$tmp/rootfs mirror
  mirror=$(debian_mirror)
  log "STAND-IN $tag: debootstrap --variant=minbase bookworm from $mirror"
  command -v debootstrap >/dev/null || { log "debootstrap is not installed"; return 1; }
  debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
    tail -n 20 "$tmp/debootstrap.log" >&2
    return 1
  }
  # As the official slim image: no docs, man pages or locales from later installs either.
  cat >"$dir/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  cat >"$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
  rm -f "$dir/etc/apt/sources.list"
  cat >"$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  find "$dir/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
  rm -rf "$dir"/usr/share/{man,info,groff,lintian,locale}/* "$dir"/var/lib/apt/lists/* \
    "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb "$dir"/var/log/*.log
  tar --numeric-owner -C "$dir" -c . |
    docker import -c 'CMD ["bash"]' -c "LABEL $label" \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" >/dev/null
  rm -rf "$dir"
}

build_rust() {
  local tag=rust:$rust_version-slim-bookworm sysroot ver ctx=$tmp/rust
  sysroot=$(rustc --print sysroot)
  ver=$(rustc --version | awk '{print $2}')
  [[ $ver == "$rust_version" || $ver == "$rust_version".* ]] || {
    log "$tag: this machine's rustc is $ver, not $rust_version; cannot build a stand-in"
    return 1
  }
  log "STAND-IN $tag: debian:bookworm-slim + gcc + this machine's Rust $ver ($sysroot)"
  mkdir -p "$ctx/toolchain"
  cp -r "$tmp/certs" "$ctx/certs"
  # bin, lib (rustc's libraries, the std rlibs and rustlib/<target>/bin/gcc-ld, which the linker
  # needs) and libexec; not share/ (docs) nor rust-src.
  tar -C "$sysroot" --exclude=lib/rustlib/src -c bin lib libexec | tar -C "$ctx/toolchain" -x
  cat >"$ctx/Dockerfile" <<EOF
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \\
 && rm -rf /var/lib/apt/lists/*
COPY certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$ver
COPY toolchain/ /usr/local/rustup/toolchains/$ver-x86_64-unknown-linux-gnu/
RUN mkdir -p /usr/local/cargo/bin \\
 && for b in cargo rustc rustdoc; do \\
      ln -s /usr/local/rustup/toolchains/$ver-x86_64-unknown-linux-gnu/bin/\$b /usr/local/cargo/bin/\$b; \\
    done \\
 && chmod -R a+w /usr/local/cargo \\
 && cargo --version && rustc --version
LABEL $label
EOF
  docker_build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

find_python() {
  local want=$python_version p
  # pyenv's shims exist for versions that are not selected, so each candidate is tried in turn.
  for p in "${PYTHON312:-}" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want" \
    "$(command -v "python$want" 2>/dev/null || true)"; do
    if [[ -n $p && -x $p ]] && "$p" -c 'import sys; print(sys.prefix)' 2>/dev/null; then
      return 0
    fi
  done
  return 1
}

build_python() {
  local tag=python:$python_version-slim-bookworm prefix ctx=$tmp/python
  prefix=$(find_python) || {
    log "$tag: no CPython $python_version on this machine (set PYTHON312); cannot build a stand-in"
    return 1
  }
  log "STAND-IN $tag: debian:bookworm-slim + this machine's CPython at $prefix"
  mkdir -p "$ctx/python"
  cp -r "$tmp/certs" "$ctx/certs"
  tar -C "$prefix" --exclude="lib/python$python_version/test" --exclude=__pycache__ -c . |
    tar -C "$ctx/python" -x
  # The interpreter finds libpython through the RPATH of its build prefix: keep that path.
  cat >"$ctx/Dockerfile" <<EOF
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 \\
      libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libreadline8 \\
 && rm -rf /var/lib/apt/lists/*
COPY certs/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
COPY python/ $prefix/
RUN for b in python3 python pip3 pip; do ln -sf $prefix/bin/\$b /usr/local/bin/\$b; done \\
 && ln -sf $prefix/bin/python$python_version /usr/local/bin/python3 \\
 && ln -sf $prefix/bin/python$python_version /usr/local/bin/python \\
 && python3 -m pip --version
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PYTHON_VERSION=$python_version
CMD ["python3"]
LABEL $label
EOF
  docker_build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_nats() {
  local tag=$nats_image ctx=$tmp/nats bin=$cache/nats-server-static-$nats_server_version/nats-server
  log "STAND-IN $tag: debian:bookworm-slim + a static nats-server $nats_server_version + wget"
  if [[ ! -x $bin ]]; then
    command -v go >/dev/null || { log "Go is needed to build nats-server"; return 1; }
    mkdir -p "${bin%/*}"
    CGO_ENABLED=0 GOBIN=${bin%/*} GOFLAGS=-mod=mod \
      go install "github.com/nats-io/nats-server/v2@$nats_server_version" 2>"$tmp/go.log" || {
      tail -n 20 "$tmp/go.log" >&2
      return 1
    }
  fi
  mkdir -p "$ctx"
  cp "$bin" "$ctx/nats-server"
  # The official image's entrypoint: arguments that start with '-' are nats-server's.
  cat >"$ctx/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  set -- nats-server "$@"
fi
exec "$@"
EOF
  chmod 0755 "$ctx/docker-entrypoint.sh"
  cat >"$ctx/nats-server.conf" <<'EOF'
port: 4222
http: 8222
EOF
  cat >"$ctx/Dockerfile" <<EOF
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends wget \\
 && rm -rf /var/lib/apt/lists/*
COPY nats-server /usr/local/bin/nats-server
COPY docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
COPY nats-server.conf /etc/nats/nats-server.conf
EXPOSE 4222 6222 8222
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["nats-server", "--config", "/etc/nats/nats-server.conf"]
LABEL $label org.embatch.nats-server=$nats_server_version
EOF
  docker_build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_prometheus() {
  local tag=$prometheus_image ctx=$tmp/prometheus want=${prometheus_image##*:v} have_version
  # Debian's package version, e.g. 2.42.0+ds-5+deb12u1: its upstream part must be the pin.
  have_version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: \([0-9.]*\).*/\1/p')
  [[ $have_version == "$want" ]] || {
    log "$tag: Debian's prometheus package is ${have_version:-unknown} here, not $want; cannot build a stand-in"
    return 1
  }
  log "STAND-IN $tag: debian:bookworm-slim + Debian's prometheus $have_version + wget"
  mkdir -p "$ctx"
  # policy-rc.d: the package's maintainer scripts must not start the service inside the build.
  # /bin/prometheus is the official image's entrypoint (bookworm's /bin is /usr/bin); the
  # official image runs as nobody in /prometheus, its TSDB volume.
  cat >"$ctx/Dockerfile" <<EOF
FROM debian:bookworm-slim
RUN printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d \\
 && apt-get update && apt-get install -y --no-install-recommends prometheus wget \\
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \\
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus \\
 && /bin/prometheus --version
USER nobody
WORKDIR /prometheus
VOLUME /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
LABEL $label org.embatch.prometheus=$have_version
EOF
  docker_build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# A nats stand-in built for another nats/VERSION (same minor, so the same tag) is rebuilt.
nats_stand_in_stale() {
  local built
  is_stand_in "$nats_image" || return 1
  built=$(docker image inspect -f '{{index .Config.Labels "org.embatch.nats-server"}}' "$nats_image")
  [[ $built != "$nats_server_version" ]]
}

# debian first: the other stand-ins build on it.
get debian:bookworm-slim || build_debian
get "rust:$rust_version-slim-bookworm" || build_rust
get "python:$python_version-slim-bookworm" || build_python
if nats_stand_in_stale; then
  log "$nats_image: a stand-in of another nats-server than $nats_server_version; rebuilding"
  build_nats
else
  get "$nats_image" || build_nats
fi
get "$prometheus_image" || build_prometheus

for tag in debian:bookworm-slim "rust:$rust_version-slim-bookworm" \
  "python:$python_version-slim-bookworm" "$nats_image" "$prometheus_image"; do
  have "$tag" || { log "$tag: missing"; exit 1; }
  if is_stand_in "$tag"; then kind="STAND-IN built from Debian packages"; else kind=official; fi
  log "$tag: $kind, $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
done
