"""Steady state: the recovery scenarios' stack and load without faults, to measure what the
recovery machinery (acknowledgements, resends, heartbeats, the client's inbox routing) costs the
p99 when nothing goes wrong.

Kept apart from scenarios.py (like bulk.py): this module adds its scenario to SCENARIOS /
SCENARIO_FUNCS and its renderer to render.py's tables.

With `EMBATCH_BASELINE_BIN_DIR` set to a directory holding another build's three binaries
(embatch-gateway, embatch-worker, embatch-loadtest, e.g. a release build of an older commit),
the scenario alternates the two builds over `EMBATCH_STEADY_PAIRS` pairs (default 4), the first
build of each pair alternating too, so drift in a shared machine's load falls on both sides; each
build runs with its own load generator (so the NATS path is each build's own client) and its own
defaults, against this build's fake upstream (the instrument stays the same). The comparison is made within a pair: p99 of this build / p99 of the baseline."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from . import scenarios as sc
from .procs import BenchError, log
from .report import failures, fmt_ms, lat
from .stack import Stack

# The recovery scenarios' rate (1,000 req/s), and half of one GPU-like upstream's full-batch
# ceiling (~2,837 req/s at MAX_BATCH_SIZE 32), each through the gateway and NATS direct.
STEADY_PATHS = ("gateway", "nats")
STEADY_WORKER = {"SHUTDOWN_GRACE": "2s"}  # stop quickly between stacks; no other setting


def steady_worker(b: Stack) -> dict[str, str]:
    """STEADY_WORKER plus the command line's `--worker-setting`s (e.g. `CACHE=false`, to leave
    out what a later feature costs; a build that predates a setting ignores it), for both
    builds."""
    return {**STEADY_WORKER, **b.worker_overrides}
STEADY_TARGET = 1.05  # p99 within 5% of the baseline's
STEADY_SPREAD = 1.25  # the pairs' ratios must agree within this factor for a verdict

sc.SCENARIOS += [("steady_state", "S1. Steady state: the recovery stack without faults, p99 "
                                  "against the build before the recovery work")]
sc.SCENARIO_NAMES += ["steady_state"]


def steady_rates(b: Stack) -> list[int]:
    return [sc.RECOVERY_RATE, round(sc.ceiling(b.defaults.max_batch_size) / 2)]


def steady_stack_runs(b: Stack, build: str, pair: int, rates: list[int],
                      upstream_bin: str) -> list[dict]:
    """One stack of the recovery scenarios (nats-server, two GPU-like upstreams, workers A and B
    with their defaults, the gateway with its defaults) and, on it, an open-loop run per rate and
    path; no event. The fake upstreams are `upstream_bin`'s whatever the build, so both builds
    are measured against the same instrument."""
    runs = []
    mark = b.sup.mark()
    try:
        nats = b.nats()
        workers = []
        build_bins = b.bins
        for name in ("A", "B"):
            b.bins = {**build_bins, "embatch-loadtest": upstream_bin}
            try:
                _, up = b.fake_upstream(sc.GPU_BASE_MS, sc.GPU_PER_INPUT_US, 1,
                                        name=f"fake-upstream-{name}")
            finally:
                b.bins = build_bins
            workers.append(b.worker(nats, tei_url=up, name=f"worker-{name}", defaults_only=True,
                                    **steady_worker(b)))
        b.wait_workers(nats, workers)
        _, gw = b.gateway(nats, None)
        for rate in rates:
            for path in STEADY_PATHS:
                target = gw if path == "gateway" else nats.target()
                loadavg = os.getloadavg()[0]
                r = b.load(f"steady {build} pair {pair} {path} @ {rate} req/s", target,
                           rate=rate, warmup=b.d(2, 1), duration=b.d(15, 4),
                           timeout=sc.RECOVERY_TIMEOUT_S, workers=workers)
                # Why requests failed or were resent (counters since the stack started).
                r["counters"] = {
                    "gateway": sc.counters(gw.args[1].removesuffix("/embed") + "/metrics"),
                    "workers": [sc.counters(f"http://127.0.0.1:{w.metrics_port}/metrics")
                                for w in workers]}
                log(f"  {build} pair {pair} {path} @ {rate}: p50 {lat(r, 'p50_ms')} ms, p99 "
                    f"{lat(r, 'p99_ms')} ms, failed {r['requests']['failed']}, load average "
                    f"{loadavg:.2f}; counters {r['counters']}")
                runs.append(sc.run_entry(path, {"path": path, "build": build, "pair": pair,
                                                "rate": rate, "loadavg_before": loadavg}, r))
    finally:
        b.sup.stop_since(mark)
    return runs


def scenario_steady_state(b: Stack) -> dict:
    """This build alone, or alternating with EMBATCH_BASELINE_BIN_DIR's build over pairs."""
    baseline_dir = os.environ.get("EMBATCH_BASELINE_BIN_DIR")
    rates = steady_rates(b)
    builds = {"this": dict(b.bins)}
    if baseline_dir:
        builds["baseline"] = {name: str(Path(baseline_dir) / name) for name in b.bins}
        for path in builds["baseline"].values():
            if not os.access(path, os.X_OK):
                raise BenchError(f"EMBATCH_BASELINE_BIN_DIR: {path} is not an executable")
    pairs = int(os.environ.get("EMBATCH_STEADY_PAIRS", b.d(4, 1))) if baseline_dir else 1
    runs = []
    own = dict(b.bins)
    try:
        for pair in range(1, pairs + 1):
            order = ["baseline", "this"] if pair % 2 else ["this", "baseline"]
            for build in order:
                if build not in builds:
                    continue
                b.bins = builds[build]
                runs += steady_stack_runs(b, build, pair, rates, own["embatch-loadtest"])
    finally:
        b.bins = own
    return {"settings": {"upstream": f"one {sc.GPU_UPSTREAM} per worker", "workers": 2,
                         "worker": steady_worker(b), "gateway": "defaults",
                         "timeout_s": sc.RECOVERY_TIMEOUT_S, "rates": rates,
                         "baseline_bin_dir": baseline_dir, "pairs": pairs},
            "runs": runs}


sc.SCENARIO_FUNCS["steady_state"] = scenario_steady_state


def ratios(res: dict) -> dict[tuple[int, str], list[float]]:
    """p99 of this build / p99 of the baseline, within each pair, by (rate, path)."""
    p99 = {(run["build"], run["pair"], run["rate"], run["path"]): lat(run["report"], "p99_ms")
           for run in res["runs"]}
    out: dict[tuple[int, str], list[float]] = {}
    for (build, pair, rate, path), mine in p99.items():
        base = p99.get(("baseline", pair, rate, path))
        if build == "this" and mine is not None and base:
            out.setdefault((rate, path), []).append(mine / base)
    return out


def render_steady_state(res: dict, targets: list) -> list[str]:
    """Per pair, build, rate and path: p50/p99 and failures; with a baseline, the within-pair
    p99 ratios; the target (a ratio within STEADY_TARGET) is met when every pair meets it,
    missed when none does, and not resolved otherwise or when the pairs' ratios spread over
    STEADY_SPREAD."""
    s = res["settings"]
    changed = {k: v for k, v in s["worker"].items() if k not in STEADY_WORKER}
    defaults = ("every setting at its default" if not changed else
                "every setting at its default but " + ", ".join(f"`{k}={v}`"
                                                                for k, v in changed.items()))
    out = [f"Two workers, each on its own GPU-like fake upstream ({sc.GPU_BASE_MS} ms + "
           f"{sc.GPU_PER_INPUT_US} µs/input, one call at a time), {defaults} "
           f"(the gateway's REQUEST_TIMEOUT too), no fault; open loop at "
           + " and ".join(f"{r:,}" for r in s["rates"])
           + f" req/s through the gateway and NATS direct, client timeout {s['timeout_s']} s. "
           + (f"{s['pairs']} pairs alternating this build and the baseline "
              "(`EMBATCH_BASELINE_BIN_DIR`), each with its own load generator, both on this "
              "build's fake upstream; the first build of each pair alternates too." if s.get("baseline_bin_dir") else
              "This build only (set `EMBATCH_BASELINE_BIN_DIR` to compare with another)."),
           "", "| pair | build | rate req/s | path | load avg | failures | p50 ms | p99 ms |",
           "|---:|---|---:|---|---:|---|---:|---:|"]
    for run in res["runs"]:
        r = run["report"]
        out.append(f"| {run['pair']} | {run['build']} | {run['rate']:,} | {run['path']} "
                   f"| {run['loadavg_before']:.1f} | {failures(r)} "
                   f"| {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} |")
    rs = ratios(res)
    if rs:
        out += ["", "| rate req/s | path | p99 this / baseline, per pair | median |",
                "|---:|---|---|---:|"]
        for (rate, path), xs in sorted(rs.items()):
            med = statistics.median(xs)
            out.append(f"| {rate:,} | {path} | {', '.join(f'{x:.2f}' for x in xs)} "
                       f"| {med:.2f} |")
            # Met when every pair is within the target, missed when every pair is beyond it;
            # pairs on both sides, or pairs whose ratios spread wider than STEADY_SPREAD (a
            # machine too noisy to tell 5%), resolve nothing.
            if max(xs) > STEADY_SPREAD * min(xs):
                ok = None
            else:
                ok = (True if max(xs) <= STEADY_TARGET else False if min(xs) > STEADY_TARGET
                      else None)
            targets.append((f"steady state, {path} @ {rate:,} req/s: p99 within 5% of the "
                            "baseline's (p99 ratio within each pair: median, range)",
                            f"{med:.2f}× ({min(xs):.2f}–{max(xs):.2f})", ok))
    return out


RENDERERS = {"steady_state": render_steady_state}
SHOWS = {"steady_state": "What the recovery machinery (acknowledgements, resends, heartbeats) "
                         "costs the p99 when nothing fails, against the build before it."}
