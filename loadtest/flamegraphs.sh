#!/usr/bin/env bash
# Flamegraphs of the gateway, the worker and nats-server at benchmark 4's ceiling (instant fake
# upstream, closed loop of CONCURRENCY through the gateway, nats-server with JetStream, every
# setting at its default), one process per run, and the table of where each spends its samples
# (loadtest/profile_shares.py). The runs are `loadtest/compare_cpu.sh` runs with PROFILE set, so
# their lines give req/s and CPU per request as well.
#
# Usage: loadtest/flamegraphs.sh OUT_DIR [BIN_DIR] [CONCURRENCY] [SECONDS]
#   OUT_DIR: gets <process>.svg, <process>.folded, shares.md and runs.txt.
#   BIN_DIR: the build profiled (default target/release, built with debug info as the workspace's
#   release profile is).
# Needs perf, and inferno (`cargo install inferno`) on PATH. Rust frames are unwound from DWARF
# (`--call-graph dwarf,32768`: the release build keeps no frame pointers), nats-server's from
# frame pointers, which Go keeps. Each perf record lasts 4 s, 1 s into a run.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: loadtest/flamegraphs.sh OUT_DIR [BIN_DIR] [CONCURRENCY] [SECONDS]}
bin=${2:-$repo/target/release} conc=${3:-256} secs=${4:-8}
for tool in perf inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" >/dev/null || { echo "$tool not found (inferno: cargo install inferno)" >&2; exit 1; }
done
mkdir -p "$out"
: >"$out/runs.txt"
# The runs' temp dirs (their perf data is 100-300 MB), removed however the script ends.
dirs=()
trap 'rm -rf "${dirs[@]}"' EXIT
for process in worker gateway nats-server; do
  # cpu-clock: the sample weights are then ns of CPU, with or without hardware counters.
  perf_args="-e cpu-clock --call-graph dwarf,32768 -F 997"
  [ "$process" = nats-server ] && perf_args="-e cpu-clock -g -F 997"
  # One pair of the same build: two runs, both recorded; the second one's profile is kept, the
  # first is a warm-up (both runs' lines go to runs.txt).
  failed=0
  PROFILE=$process PERF_ARGS=$perf_args "$repo/loadtest/compare_cpu.sh" "$bin" "$bin" 1 gateway \
    "$conc" "$secs" >"$out/$process.log" 2>&1 || failed=1
  while read -r _ _ path; do dirs+=("$(dirname "$path")"); done < <(grep "^perf data:" "$out/$process.log")
  ((failed == 0)) || { echo "compare_cpu.sh failed for $process: see $out/$process.log" >&2; exit 1; }
  sed "s/^/$process: /" "$out/$process.log" | grep -v ": perf " >>"$out/runs.txt"
  data=$(grep "^perf data:" "$out/$process.log" | tail -1 | awk '{print $3}')
  [ -s "${data:-}" ] || { echo "no perf data for $process: see $out/$process.log" >&2; exit 1; }
  perf script -i "$data" 2>"$out/$process.perf-script.log" | inferno-collapse-perf --kernel >"$out/$process.folded"
  # Frames narrower than half a pixel are left out: a tenth of the file's size, nothing readable
  # lost.
  inferno-flamegraph --minwidth 0.5 \
    --title "$process: benchmark 4's ceiling, c=$conc (loadtest/flamegraphs.sh)" \
    <"$out/$process.folded" >"$out/$process.svg"
  rm -rf "${dirs[@]}"
  dirs=()
done
python3 "$repo/loadtest/profile_shares.py" "$out"/worker.folded "$out"/gateway.folded \
  "$out"/nats-server.folded | tee "$out/shares.md"
