"""Steady state: the recovery scenarios' stack and load without faults. S1 measures what the
recovery machinery (acknowledgements, resends, heartbeats, the client's inbox routing) costs the
p99 when nothing goes wrong, against the build before it, both without the embeddings cache
(which that build predates); S2 measures what the cache, on by default, costs the same load,
whose inputs never repeat.

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
# The baseline predates the embeddings cache, so S1 runs both builds without it (the older
# build ignores the setting): S1 prices the recovery machinery alone. S2 prices the cache,
# this build at its defaults against this build with `CACHE=false`.
WITHOUT_CACHE = {"CACHE": "false"}


def steady_worker(b: Stack, settings: dict[str, str] | None = None) -> dict[str, str]:
    """STEADY_WORKER, then `settings`, then the command line's `--worker-setting`s (a build
    that predates a setting ignores it)."""
    return {**STEADY_WORKER, **(settings or {}), **b.worker_overrides}
STEADY_TARGET = 1.05  # p99 within 5% of the baseline's
STEADY_SPREAD = 1.25  # the pairs' ratios must agree within this factor for a verdict

sc.SCENARIOS += [("steady_state", "S1. Steady state: the recovery stack without faults, p99 "
                                  "against the build before the recovery work"),
                 ("steady_cache", "S2. Steady state: what the embeddings cache costs when no "
                                  "input repeats")]
sc.SCENARIO_NAMES += ["steady_state", "steady_cache"]


def steady_rates(b: Stack) -> list[int]:
    return [sc.RECOVERY_RATE, round(sc.ceiling(b.defaults.max_batch_size) / 2)]


def steady_stack_runs(b: Stack, build: str, pair: int, rates: list[int],
                      upstream_bin: str, worker_env: dict[str, str]) -> list[dict]:
    """One stack of the recovery scenarios (nats-server, two GPU-like upstreams, workers A and B
    with their defaults and `worker_env`, the gateway with its defaults) and, on it, an
    open-loop run per rate and path; no event. The fake upstreams are `upstream_bin`'s whatever
    the build, so both builds are measured against the same instrument."""
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
                                    **worker_env))
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
                runs += steady_stack_runs(b, build, pair, rates, own["embatch-loadtest"],
                                          steady_worker(b, WITHOUT_CACHE))
    finally:
        b.bins = own
    return {"settings": {"upstream": f"one {sc.GPU_UPSTREAM} per worker", "workers": 2,
                         "worker": steady_worker(b, WITHOUT_CACHE), "gateway": "defaults",
                         "timeout_s": sc.RECOVERY_TIMEOUT_S, "rates": rates,
                         "baseline_bin_dir": baseline_dir, "pairs": pairs},
            "runs": runs}


# S2's two sides: this build at its defaults (the cache on) and with the cache off.
CACHE_SIDES = {"defaults": {}, "CACHE=false": WITHOUT_CACHE}


def scenario_steady_cache(b: Stack) -> dict:
    """This build over `EMBATCH_STEADY_PAIRS` pairs (default 3), each pair one stack at the
    defaults and one with `CACHE=false`, the first side of each pair alternating."""
    rates = steady_rates(b)
    pairs = int(os.environ.get("EMBATCH_STEADY_PAIRS", b.d(3, 1)))
    runs = []
    for pair in range(1, pairs + 1):
        order = list(CACHE_SIDES) if pair % 2 else list(reversed(CACHE_SIDES))
        for side in order:
            runs += steady_stack_runs(b, side, pair, rates, b.bins["embatch-loadtest"],
                                      steady_worker(b, CACHE_SIDES[side]))
    return {"settings": {"upstream": f"one {sc.GPU_UPSTREAM} per worker", "workers": 2,
                         "worker": steady_worker(b), "gateway": "defaults",
                         "timeout_s": sc.RECOVERY_TIMEOUT_S, "rates": rates, "pairs": pairs},
            "runs": runs}


sc.SCENARIO_FUNCS["steady_state"] = scenario_steady_state
sc.SCENARIO_FUNCS["steady_cache"] = scenario_steady_cache


def ratios(res: dict, mine: str = "this",
           theirs: str = "baseline") -> dict[tuple[int, str], list[float]]:
    """p99 of build `mine` / p99 of build `theirs`, within each pair, by (rate, path). A pair
    in which either side failed a request is left out ([`failed_pairs`] names it): the p99 of
    the successes beside a side that shed or timed out compares nothing."""
    p99 = {(run["build"], run["pair"], run["rate"], run["path"]): lat(run["report"], "p99_ms")
           for run in res["runs"]}
    skip = {(pair, rate, path) for pair, rate, path, _ in failed_pairs(res)}
    out: dict[tuple[int, str], list[float]] = {}
    for (build, pair, rate, path), value in p99.items():
        base = p99.get((theirs, pair, rate, path))
        if build == mine and value is not None and base and (pair, rate, path) not in skip:
            out.setdefault((rate, path), []).append(value / base)
    return out


def failed_pairs(res: dict) -> list[tuple[int, int, str, str]]:
    """(pair, rate, path, side) of every run that failed a request, in run order."""
    return [(run["pair"], run["rate"], run["path"], run["build"]) for run in res["runs"]
            if run["report"]["requests"]["failed"]]


def stack_text(s: dict) -> str:
    """The stack and load of S1 and S2, in words; `s` is a result's settings."""
    changed = {k: v for k, v in s["worker"].items() if k not in STEADY_WORKER}
    defaults = ("every setting at its default" if not changed else
                "every setting at its default but " + ", ".join(f"`{k}={v}`"
                                                                for k, v in changed.items()))
    return (f"Two workers, each on its own GPU-like fake upstream ({sc.GPU_BASE_MS} ms + "
            f"{sc.GPU_PER_INPUT_US} µs/input, one call at a time), {defaults} "
            f"(the gateway's REQUEST_TIMEOUT too), no fault; open loop of unique single-input "
            f"requests at " + " and ".join(f"{r:,}" for r in s["rates"])
            + f" req/s through the gateway and NATS direct, client timeout {s['timeout_s']} s. ")


def runs_table(res: dict, side: str) -> list[str]:
    """One row per run: pair, `side` (the build or the settings), rate, path, p50/p99."""
    out = ["", f"| pair | {side} | rate req/s | path | load avg | failures | p50 ms | p99 ms |",
           "|---:|---|---:|---|---:|---|---:|---:|"]
    for run in res["runs"]:
        r = run["report"]
        out.append(f"| {run['pair']} | {run['build']} | {run['rate']:,} | {run['path']} "
                   f"| {run['loadavg_before']:.1f} | {failures(r)} "
                   f"| {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} |")
    return out


def ratios_table(rs: dict[tuple[int, str], list[float]], what: str) -> list[str]:
    """Per rate and path: the within-pair p99 ratios `what` and their median."""
    out = ["", f"| rate req/s | path | p99 {what}, per pair | median |", "|---:|---|---|---:|"]
    for (rate, path), xs in sorted(rs.items()):
        out.append(f"| {rate:,} | {path} | {', '.join(f'{x:.2f}' for x in xs)} "
                   f"| {statistics.median(xs):.2f} |")
    return out


def render_steady_state(res: dict, targets: list) -> list[str]:
    """Per pair, build, rate and path: p50/p99 and failures; with a baseline, the within-pair
    p99 ratios; the target (a ratio within STEADY_TARGET) is met when every pair meets it,
    missed when none does, and not resolved otherwise or when the pairs' ratios spread over
    STEADY_SPREAD."""
    s = res["settings"]
    out = [stack_text(s)
           + (f"{s['pairs']} pairs alternating this build and the baseline "
              "(`EMBATCH_BASELINE_BIN_DIR`), each with its own load generator, both on this "
              "build's fake upstream; the first build of each pair alternates too."
              + (" The baseline predates the embeddings cache, so both run without it (S2 "
                 "prices it)." if s["worker"].get("CACHE") == "false" else "")
              if s.get("baseline_bin_dir") else
              "This build only (set `EMBATCH_BASELINE_BIN_DIR` to compare with another).")]
    out += runs_table(res, "build")
    rs = ratios(res)
    left_out = failed_pairs(res)
    if left_out:
        out += ["", "Left out of the ratios, as a side failed requests there: "
                + "; ".join(f"pair {pair} at {rate:,} req/s over {path} ({side})"
                            for pair, rate, path, side in left_out) + "."]
    if rs:
        out += ratios_table(rs, "this / baseline")
        for (rate, path), xs in sorted(rs.items()):
            med = statistics.median(xs)
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


def render_steady_cache(res: dict, targets: list) -> list[str]:
    """Per pair, side, rate and path: p50/p99 and failures, then the within-pair p99 ratios of
    the defaults to `CACHE=false`. No target: what the cache costs traffic that never repeats,
    recorded (docs/design/cache.md)."""
    s = res["settings"]
    out = [stack_text(s) + f"{s['pairs']} pairs of this build, one stack at the defaults (the "
           "cache on: every input misses, is stored in the worker's LRU and written to the "
           "shared JetStream KV bucket) and one with `CACHE=false`, the first side of each "
           "pair alternating."]
    out += runs_table(res, "settings")
    rs = ratios(res, "defaults", "CACHE=false")
    if rs:
        out += ratios_table(rs, "defaults / `CACHE=false`")
    return out


RENDERERS = {"steady_state": render_steady_state, "steady_cache": render_steady_cache}
SHOWS = {"steady_state": "What the recovery machinery (acknowledgements, resends, heartbeats) "
                         "costs the p99 when nothing fails, against the build before it.",
         "steady_cache": "What the embeddings cache, on by default, costs the p99 of traffic "
                         "whose inputs never repeat: every input a miss and a write to the "
                         "shared bucket."}
