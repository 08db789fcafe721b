# Sourced by scripts/quickstart.sh, scripts/client-tests.sh and scripts/trace-check.sh: progress
# lines and the processes a script starts, stopped in reverse order on exit (gateway and worker
# first, so they drain and flush through NATS, nats-server last).
#
# Use: `source scripts/processes.sh`, then `pids+=($!)` after each background start and
# `trap stop_started EXIT` (or call stop_started from the script's own EXIT trap), or `use_tmp`
# for a `$tmp` directory removed on exit as well.

# Prints `==> what` to stderr.
step() { printf '\n==> %s\n' "$*" >&2; }

# The background processes started so far, oldest first.
pids=()

# Sends SIGTERM to every process in `pids`, newest first, and waits for each to exit.
stop_started() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}

# Makes `$tmp`, a directory for the run's files and logs, and traps EXIT to stop every started
# process and remove it.
use_tmp() {
  tmp=$(mktemp -d)
  trap 'stop_started; rm -rf "$tmp"' EXIT
}

# Prints a free TCP port on 127.0.0.1 (the OS picks it).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Prints the last 30 lines of each log under `$tmp` to stderr.
show_logs() { for f in "$tmp"/*.log; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done; }

# Runs `cmd...` every 0.2 s until it succeeds, for at most `seconds` and while every started
# process lives; fails when it never did. Use: `poll seconds cmd...`.
poll() {
  local tries=$(($1 * 5))
  shift
  for _ in $(seq 1 "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done
    sleep 0.2
  done
  return 1
}

# Whether something listens on TCP port `port` of 127.0.0.1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
