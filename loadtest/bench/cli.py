"""embatch benchmarks: one command that builds, starts, measures and stops everything itself.

    python3 loadtest/bench.py              # the full matrix (about 10-12 minutes)
    python3 loadtest/bench.py --quick      # short runs, for development (results in results/quick/)
    python3 loadtest/bench.py --only overload [--only tuning ...]

(`python3 -m loadtest.bench` from the repository root is the same.) It builds the release
binaries (`cargo build --release --locked -p embatch-gateway -p embatch-worker -p
embatch-loadtest`), or takes them from $EMBATCH_BIN_DIR when that is set, reads their defaults
from their `--help`, finds nats-server (`scripts/install-nats-server.sh`) and, for the scenarios
that need it, the built-in model (`scripts/fetch-model.sh`), then for each scenario starts its
own stack on free 127.0.0.1 ports (nats-server, fake upstreams, workers, the gateway), drives it
with `embatch-loadtest run`, and stops every process it started (by PID, also on Ctrl-C or an
error).

Output: one raw JSON file per scenario, `loadtest/results/<scenario>.json` (the settings, every
loadtest report as `embatch-loadtest run --json` wrote it, and derived numbers),
`loadtest/results/RESULTS.md`, rendered from all scenario files present, so `--only X` refreshes
one section and keeps the others, the same tables in docs/benchmarks.md, and SVG charts in
`loadtest/results/charts/` from the same files. Logs of every process go to a temporary directory
(printed). `--render-only` redraws the tables and `--charts-only` the charts from the JSON files
at hand, without running anything.

Python 3 standard library only, but for the charts: they run in .bin/bench-venv with the
matplotlib pinned in loadtest/requirements.txt, installed on first use (`--no-charts` skips
them). Linux only (CPU time is read from /proc/PID/stat).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .defaults import BinaryDefaults, DefaultsError
from .procs import REPO, BenchError, Terminated, load_average, log
from .results import (RESULTS_DIR, machine_info, machine_line, utc_now, write_charts,
                      write_results)
from .scenarios import SCENARIO_FUNCS, SCENARIO_NAMES, SCENARIOS, worker_base
from .stack import Stack, remove_stores

BINARIES = ("embatch-gateway", "embatch-worker", "embatch-loadtest")


def build() -> dict[str, str]:
    cmd = ["cargo", "build", "--release", "--locked", "-p", "embatch-gateway", "-p",
           "embatch-worker", "-p", "embatch-loadtest", "--message-format=json-render-diagnostics"]
    log("$ " + shlex.join(cmd[:-1]))
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise BenchError("cargo build failed")
    bins = {}
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        exe = msg.get("executable")
        if msg.get("reason") == "compiler-artifact" and exe:
            bins[Path(exe).name] = exe
    missing = set(BINARIES) - bins.keys()
    if missing:
        raise BenchError(f"cargo build produced no {', '.join(sorted(missing))}")
    return bins


def binaries(no_build: bool) -> dict[str, str]:
    """The three binaries: from $EMBATCH_BIN_DIR, target/release as it is (--no-build), or a
    fresh release build."""
    bin_dir = os.environ.get("EMBATCH_BIN_DIR")
    if not bin_dir and no_build:
        bin_dir = str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release")
    if not bin_dir:
        return build()
    log(f"binaries from {bin_dir} (not built)")
    return {name: str(Path(bin_dir) / name) for name in BINARIES}


def wait_idle(max_wait: float, threshold: float) -> None:
    deadline = time.monotonic() + max_wait
    while load_average() >= threshold and time.monotonic() < deadline:
        log(f"load average {load_average():.2f} ≥ {threshold}: waiting for the machine to calm "
            "down")
        time.sleep(15)


def on_terminate(signum, frame):
    raise Terminated(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    prog = None if Path(sys.argv[0]).name == "bench.py" else "python3 -m loadtest.bench"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="short runs and fewer points, for development; results go to "
                             "loadtest/results/quick/ unless --out is given")
    parser.add_argument("--only", action="append", choices=SCENARIO_NAMES, metavar="SCENARIO",
                        help="run only this scenario (repeatable): " + ", ".join(SCENARIO_NAMES))
    parser.add_argument("--out", type=Path, help="results directory (default loadtest/results)")
    parser.add_argument("--no-build", action="store_true",
                        help="use target/release binaries as they are")
    parser.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                        help="first wait up to this long for the 1-minute load average to drop "
                             "below --max-load")
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--worker-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment setting for every worker the scenarios start from "
                             "worker_base (repeatable; recorded in the results), e.g. "
                             "DISPATCH_WHEN_IDLE=false to measure the other way of a default")
    parser.add_argument("--render-only", action="store_true",
                        help="only regenerate RESULTS.md and docs/benchmarks.md from the JSON "
                             "files")
    parser.add_argument("--charts-only", action="store_true",
                        help="only redraw the charts (results/charts/*.svg) from the JSON files, "
                             "installing the pinned matplotlib into .bin/bench-venv if needed")
    parser.add_argument("--no-charts", action="store_true",
                        help="do not draw the charts (no matplotlib needed)")
    return parser.parse_args(argv)


def run_scenario(bench: Stack, name: str, quick: bool, command: str, out_dir: Path) -> bool:
    """Runs one scenario on its own stack and writes <name>.json; False if it failed."""
    title = dict(SCENARIOS)[name]
    log(f"== {title}")
    started = time.monotonic()
    machine = machine_info(command)
    info = {"scenario": name, "title": title, "quick": quick, "started": utc_now(),
            "loadavg_before": load_average(), "command": command,
            "machine": machine_line(machine), "commit": machine["commit"]}
    mark = bench.sup.mark()
    try:
        result = SCENARIO_FUNCS[name](bench)
    except BenchError as e:
        log(f"scenario {name} failed: {e}")
        return False
    finally:
        bench.sup.stop_since(mark)
    info["wall_s"] = time.monotonic() - started
    info.update(result)
    (out_dir / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if sys.platform != "linux":
        print("bench.py needs Linux (/proc)", file=sys.stderr)
        return 2
    out_dir = args.out or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.render_only or args.charts_only:
        if args.charts_only and not write_charts(out_dir):
            return 1
        if args.render_only:
            write_results(out_dir)
        return 0

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGHUP, on_terminate)
    entry = ("python3 loadtest/bench.py" if Path(sys.argv[0]).name == "bench.py"
             else "python3 -m loadtest.bench")
    command = entry + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    log_dir = Path(tempfile.mkdtemp(prefix="embatch-bench-"))
    bench = None
    failed = []
    try:
        bins = binaries(args.no_build)
        defaults = BinaryDefaults.read(bins)
        log(f"binary defaults: subject {defaults.subject!r}, MAX_BATCH_SIZE "
            f"{defaults.max_batch_size}, MAX_WAIT_TIME {defaults.max_wait_ms} ms")
        nats_bin = subprocess.run([str(REPO / "scripts" / "install-nats-server.sh")], cwd=REPO,
                                  check=True, stdout=subprocess.PIPE,
                                  text=True).stdout.strip().splitlines()[-1]
        if args.wait_idle > 0:
            wait_idle(args.wait_idle, args.max_load)
        names = args.only or SCENARIO_NAMES
        meta = machine_info(command)
        # machine.json names the machine and command of the page's header and of the charts
        # whose results predate a machine of their own. A partial run (--only) leaves it to the
        # run that wrote it: each scenario's JSON names its own machine and command, and the
        # page marks a section measured elsewhere ("not the one named above").
        if not (args.only and (out_dir / "machine.json").is_file()):
            (out_dir / "machine.json").write_text(json.dumps(meta, indent=2) + "\n")
        log(f"{meta['cores']} cores, load average {meta['loadavg_start']:.2f}; logs in {log_dir}")
        base = worker_base(defaults)
        overrides = {}
        for setting in args.worker_setting:
            key, sep, value = setting.partition("=")
            if not sep or not key:
                raise BenchError(f"--worker-setting {setting!r}: expected KEY=VALUE")
            overrides[key] = value
        bench = Stack(args.quick, bins, nats_bin, log_dir, defaults, {**base, **overrides})
        bench.worker_overrides = overrides
        for name in names:
            if not run_scenario(bench, name, args.quick, command, out_dir):
                failed.append(name)
        # Charts first: the tables link only the charts that exist.
        if not args.no_charts:
            write_charts(out_dir)
        write_results(out_dir)
    except (KeyboardInterrupt, Terminated) as e:
        log(f"interrupted ({e.__class__.__name__}): stopping everything")
        return 130
    except (BenchError, DefaultsError) as e:
        log(f"error: {e}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if bench is not None:
            bench.sup.stop_all()
        freed = remove_stores(log_dir)
        log(f"process logs: {log_dir}"
            + (f" (JetStream stores removed: {freed / 1e6:,.0f} MB)" if freed else ""))
    if failed:
        log(f"failed scenarios: {', '.join(failed)}")
        return 1
    return 0
