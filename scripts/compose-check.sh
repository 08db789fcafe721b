#!/usr/bin/env bash
# Validates the deployment files without a Docker engine, one program per concern (scripts/checks/):
#   compose  compose.py: `docker compose config` per profile set with .env.example, .env (if any) and
#            no env file; the services each set enables, and their wiring as rendered.
#   nats     nats_configs.py: nats/nats.conf, nats/cluster/*.conf, nats/regions/*.conf pass `nats-server -t`; max_payload;
#            the nats-server used, compose.yaml's nats image and the Helm values' nats image tag
#            are the release pinned in nats/VERSION (its minor, for the image tags).
#   docker   dockerfile/ (Go, BuildKit's frontend): every stage converts with the linter on and
#            tagged base images; .dockerignore lets the right files into the build context.
# .env.example vs compose.yaml and "compose sets only the binaries' flags" are checked by
# gateway/tests/deploy_files.rs; n1..n3 forming a cluster by gateway/tests/cluster.rs.
# Fetches when missing: the Compose CLI plugin (go install, a few minutes; scripts/container-engine.sh),
# nats-server (scripts/install-nats-server.sh); builds the Dockerfile checker into
# ~/.cache/embatch-compose-check.
# Env: NATS_SERVER (nats-server to use), COMPOSE_CHECK_SKIP (comma-separated: compose,nats,docker).
# Ends with "compose-check: N passed, M failed", non-zero on a failure. Leaves nothing in the repo.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
checks=$root/scripts/checks
cache=${XDG_CACHE_HOME:-$HOME/.cache}/embatch-compose-check
passed=0 failed=0
enabled() { [[ ,${COMPOSE_CHECK_SKIP:-}, != *",$1,"* ]]; }
fail() { echo "FAIL  $*" >&2; failed=$((failed + 1)); }

# run NAME CMD...: runs a check program printing "ok MSG", "info MSG" or "fail MSG" per line and
# counts them; any other line is a failure, as is a non-zero exit without a "fail" line.
run() {
  local name=$1 line status=0 out
  shift
  printf '\n== %s\n' "$name"
  out=$("$@" 2>&1) || status=$?
  while IFS= read -r line; do
    case $line in
      ok\ *) echo "ok    ${line#ok }"; passed=$((passed + 1)) ;;
      info\ *) echo "      ${line#info }" ;;
      "") ;;
      *) fail "${line#fail }" ;;
    esac
  done <<<"$out"
  if ((status != 0)) && ! grep -q '^fail ' <<<"$out"; then fail "$name: exited with status $status"; fi
}

# compose: the `docker compose` CLI plugin; built from its Go module when missing
# (scripts/container-engine.sh, shared with scripts/compose-e2e.sh). `config` needs no engine.
compose=(docker compose)
if enabled compose && ! docker compose version >/dev/null 2>&1; then
  # shellcheck source=scripts/container-engine.sh
  source "$root/scripts/container-engine.sh"
  compose_install
fi

enabled compose && run "compose: $("${compose[@]}" version --short)" python3 "$checks/compose.py" "${compose[@]}"
enabled nats && run nats python3 "$checks/nats_configs.py" "${NATS_SERVER:-$("$root/scripts/install-nats-server.sh")}"
if enabled docker; then
  # Built apart from `run`, which counts every line it captures: on a machine whose Go module
  # cache is empty, `go build` reports each module it downloads on stderr.
  mkdir -p "$cache"
  if (cd "$checks/dockerfile" && go build -o "$cache/dockerfile-check" .); then
    run "docker: Dockerfile and .dockerignore" "$cache/dockerfile-check" "$root"
  else
    fail "docker: cannot build the Dockerfile checker (scripts/checks/dockerfile)"
  fi
fi

echo
echo "compose-check: $passed passed, $failed failed"
((failed == 0))
