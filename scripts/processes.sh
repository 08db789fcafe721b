# Sourced by scripts/quickstart.sh and scripts/client-tests.sh: progress lines and the processes a
# script starts, stopped in reverse order on exit (gateway and worker first, so they drain and
# flush through NATS, nats-server last).
#
# Use: `source scripts/processes.sh`, then `pids+=($!)` after each background start and
# `trap stop_started EXIT` (or call stop_started from the script's own EXIT trap).

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
