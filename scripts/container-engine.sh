# shellcheck shell=bash
# A Docker engine and the Compose v2 CLI plugin for scripts/compose-e2e.sh, on a Debian machine
# with nothing installed by hand. Sourced, not run: it defines functions and keeps its state
# (the dockerd it started, the networking state before it) in ENGINE_* variables.
#
#   engine_install    apt-get installs docker.io (dockerd, containerd, runc), iptables (the NAT
#                     that builds need to reach package registries), nftables (to list and remove
#                     dockerd's tables) and debootstrap (stand-in base images,
#                     scripts/base-images.sh) when missing.
#   compose_install   builds Compose v2 from its Go module when `docker compose` is missing
#                     (Debian only packages v1, which rejects `required: false`); the binary is
#                     cached in ~/.cache/embatch/compose-<version> and installed as the CLI plugin
#                     /usr/local/lib/docker/cli-plugins/docker-compose (without root or sudo:
#                     ~/.docker/cli-plugins). Also used by scripts/compose-check.sh.
#   engine_start      uses a running engine if `docker info` answers; otherwise records ip_forward,
#                     the network links and the nft tables, then starts dockerd in the background
#                     and waits for it; its PID (ENGINE_PID) comes from its pid file.
#   engine_stop       only if engine_start started dockerd: stops it by its PID (SIGTERM, SIGKILL
#                     after 60 s), then deletes the links and nft tables that were not there before
#                     (docker0, DOCKER chains), restores the iptables rules of tables that were
#                     there before, and puts ip_forward back. Idempotent.
# Env: EMBATCH_COMPOSE_VERSION (v2.29.7), EMBATCH_DOCKERD_LOG (dockerd's log file).

ENGINE_COMPOSE_VERSION=${EMBATCH_COMPOSE_VERSION:-v2.29.7}
ENGINE_CACHE=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/embatch
ENGINE_PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
ENGINE_PID=
ENGINE_STARTED=0

engine_log() { printf 'engine: %s\n' "$*" >&2; }

# Root or sudo for apt-get, dockerd and ip/nft.
engine_sudo() {
  if ((EUID == 0)); then "$@"; else sudo "$@"; fi
}

engine_install() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v nft >/dev/null 2>&1 || missing+=(nftables) # to list and remove dockerd's tables
  if ((${#missing[@]} == 0)); then return 0; fi
  engine_log "installing ${missing[*]} with apt-get"
  engine_sudo apt-get update -qq
  # docker.io pulls in containerd and runc; it starts nothing here (no systemd in this machine).
  engine_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  # docker.io's own CLI must not shadow a newer one that was already on PATH.
  hash -r
}

compose_install() {
  if docker compose version >/dev/null 2>&1; then return 0; fi
  local cached=$ENGINE_CACHE/compose-$ENGINE_COMPOSE_VERSION/docker-compose
  if [[ ! -x $cached ]]; then
    command -v go >/dev/null 2>&1 || {
      engine_log "Compose v2 is missing and Go is not installed to build it"
      return 1
    }
    engine_log "building Compose $ENGINE_COMPOSE_VERSION from its Go module (a few minutes)"
    mkdir -p "${cached%/*}"
    if ! GOBIN=${cached%/*}/gobin go install \
      -ldflags "-X github.com/docker/compose/v2/internal.Version=$ENGINE_COMPOSE_VERSION" \
      "github.com/docker/compose/v2/cmd@$ENGINE_COMPOSE_VERSION" >"${cached%/*}/build.log" 2>&1; then
      tail -n 20 "${cached%/*}/build.log" >&2
      return 1
    fi
    mv "${cached%/*}/gobin/cmd" "$cached"
    rmdir "${cached%/*}/gobin"
  fi
  # System-wide where we may write there, else for this user only.
  local dir=$ENGINE_PLUGIN_DIR
  if ! { ((EUID == 0)) || sudo -n true 2>/dev/null; }; then
    dir=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
    mkdir -p "$dir" && install -m 0755 "$cached" "$dir/docker-compose"
  else
    engine_sudo mkdir -p "$dir"
    engine_sudo install -m 0755 "$cached" "$dir/docker-compose"
  fi
  engine_log "installed Compose $ENGINE_COMPOSE_VERSION as $dir/docker-compose"
  docker compose version >/dev/null
}

# The names of the network links and nft tables, one per line.
engine_links() { ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort; }
engine_nft_tables() { engine_sudo nft list tables 2>/dev/null | sort; }

engine_start() {
  if docker info >/dev/null 2>&1; then
    engine_log "using the Docker engine that is already running"
    return 0
  fi
  ENGINE_IP_FORWARD=$(cat /proc/sys/net/ipv4/ip_forward)
  ENGINE_LINKS_BEFORE=$(engine_links)
  ENGINE_NFT_BEFORE=$(engine_nft_tables)
  ENGINE_IPTABLES_BEFORE=$(engine_sudo iptables-save 2>/dev/null || true)
  local log=${EMBATCH_DOCKERD_LOG:-$ENGINE_CACHE/dockerd.log}
  mkdir -p "${log%/*}"
  engine_log "starting dockerd (log: $log)"
  # setsid: a session of its own, so a Ctrl-C in this shell reaches dockerd only through
  # engine_stop. Its PID is read from the pid file it writes (setsid may fork, sudo does).
  engine_sudo rm -f /var/run/docker.pid
  engine_sudo setsid dockerd --storage-driver=overlay2 --host=unix:///var/run/docker.sock \
    --pidfile=/var/run/docker.pid >"$log" 2>&1 </dev/null &
  ENGINE_STARTED=1
  local i
  for ((i = 0; i < 120; i++)); do
    if [[ -z $ENGINE_PID && -s /var/run/docker.pid ]]; then
      ENGINE_PID=$(cat /var/run/docker.pid)
      [[ $(cat "/proc/$ENGINE_PID/comm" 2>/dev/null) == dockerd ]] || ENGINE_PID=
    fi
    if [[ -n $ENGINE_PID ]] && docker info >/dev/null 2>&1; then
      engine_log "dockerd $(docker version --format '{{.Server.Version}}') is up (pid $ENGINE_PID)"
      return 0
    fi
    sleep 0.5
  done
  engine_log "dockerd did not come up; the end of its log:"
  tail -n 30 "$log" >&2
  return 1
}

engine_stop() {
  ((ENGINE_STARTED)) || return 0
  ENGINE_STARTED=0
  if [[ -n $ENGINE_PID ]] && kill -0 "$ENGINE_PID" 2>/dev/null; then
    engine_log "stopping the dockerd this script started (pid $ENGINE_PID)"
    engine_sudo kill -TERM "$ENGINE_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 120; i++)); do
      kill -0 "$ENGINE_PID" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$ENGINE_PID" 2>/dev/null; then
      engine_log "dockerd still running after 60 s: SIGKILL"
      engine_sudo kill -KILL "$ENGINE_PID" 2>/dev/null || true
    fi
  fi
  # Networking state that was not there before dockerd: its bridges and veths, its nft tables
  # (Debian's iptables is iptables-nft, so the DOCKER chains live in nft tables `ip filter` and
  # `ip nat`), and ip_forward.
  local link table
  for link in $(comm -13 <(echo "$ENGINE_LINKS_BEFORE") <(engine_links)); do
    engine_log "removing link $link"
    engine_sudo ip link delete "$link" 2>/dev/null || true
  done
  while IFS= read -r table; do
    [[ -n $table ]] || continue
    engine_log "removing nft $table"
    # shellcheck disable=SC2086 # "table ip nat" -> nft delete table ip nat
    engine_sudo nft delete ${table} 2>/dev/null || true
  done < <(comm -13 <(echo "$ENGINE_NFT_BEFORE") <(engine_nft_tables))
  # Tables that were there before keep dockerd's chains (DOCKER, DOCKER-USER, ...): back to the
  # rules they had.
  if grep -q '^\*' <<<"${ENGINE_IPTABLES_BEFORE:-}"; then
    engine_log "restoring the iptables rules of before"
    engine_sudo iptables-restore <<<"$ENGINE_IPTABLES_BEFORE" || true
  fi
  if [[ -n ${ENGINE_IP_FORWARD:-} ]]; then
    echo "$ENGINE_IP_FORWARD" | engine_sudo tee /proc/sys/net/ipv4/ip_forward >/dev/null
  fi
}
