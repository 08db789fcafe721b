#!/usr/bin/env bash
# CPU per request on a quiet many-core machine (the GPU machine's 16 cores; the GPU is not
# used): the pipeline against the upstream called directly, and what tenants cost, with
# loadtest/compare_cpu.sh (instant fake upstream, closed loop, one stack per run). Uses the
# release binaries loadtest/gpu/pack.sh put in .gpu/bin.tar.xz, like run.sh. nats-server runs
# with JetStream, as deployed (compare_cpu.sh's default); `NATS_ARGS=` gives core NATS alone, the
# setup of the published 16-core table (build 943da1c).
#
# Usage: OUT=DIR loadtest/gpu/cpu_costs.sh [PAIRS] [SECONDS]
# Writes DIR/cpu_costs.log: the lines of each comparison, under a header naming it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pack=${GPU_PACK:-.gpu}
out=${OUT:?set OUT to the output directory}
pairs=${1:-3} secs=${2:-6}
bin=$(mktemp -d /tmp/embatch-cpu-bin.XXXXXX)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack/bin.tar.xz" "$bin"
# compare_cpu.sh takes its instrument (load generator, fake upstream) from target/release.
mkdir -p target/release
ln -sf "$bin/embatch-loadtest" target/release/embatch-loadtest
export NATS_SERVER_BIN=$bin/nats-server
tenants=$(mktemp -d)
printf '[tenants.solo]\nkeys = ["sk-solo"]\nrequests_per_minute = 100000000\ntokens_per_minute = 10000000000\n' \
  >"$tenants/one.toml"
keys=""
for i in 1 2 3 4 5 6 7 8; do
  printf '[tenants.t%s]\nkeys = ["sk-t%s"]\nrequests_per_minute = 100000000\ntokens_per_minute = 10000000000\n\n' \
    "$i" "$i" >>"$tenants/eight.toml"
  keys="$keys sk-t$i"
done
log=$out/cpu_costs.log
mkdir -p "$out"
{
  echo "# build $(cat "$bin/BUILD_COMMIT"); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo)"
  for path in direct nats gateway; do
    echo "## pipeline: $path, closed loop c=256 (before and after are the same build)"
    loadtest/compare_cpu.sh "$bin" "$bin" 1 "$path" 256 "$secs"
  done
  echo "## tenants: before = open gateway, after = a tenants file of one tenant (its key sent)"
  EMBATCH_API_KEY=sk-solo AFTER_ENV="TENANTS_FILE=$tenants/one.toml" \
    loadtest/compare_cpu.sh "$bin" "$bin" "$pairs" gateway 256 "$secs"
  echo "## tenants: before = open gateway, one closed loop per key of 8 (32 each, no file: all 'default'); after = 8 tenants contending"
  LOAD_KEYS="$keys" AFTER_ENV="TENANTS_FILE=$tenants/eight.toml" \
    loadtest/compare_cpu.sh "$bin" "$bin" "$pairs" gateway 256 "$secs"
} 2>&1 | tee "$log"
