"""Tenants sharing one worker: a noisy neighbour against a light tenant, and two tenants over
capacity with weights 2:1 (docs/tenants.md, "Fair share").

Kept apart from scenarios.py (like twomodels.py): this module adds its scenario to SCENARIOS /
SCENARIO_FUNCS (scenarios.py imports it last) and its renderer to render.py's tables.

The stack: nats-server, one GPU-like fake upstream made slower than the other scenarios' (so
that 3x its capacity is a load this 2-core machine can generate), one worker reading a tenants
file (tenants `a` and `b`) with the cache off, and the load on NATS with `Embatch-Tenant: <name>`
(`embatch-loadtest run --nats --tenant`): a worker takes that header from callers in its own
account, as it takes it from the gateway. Open loop, distinct single-input requests."""

from __future__ import annotations

import os
import threading
import time

from . import scenarios as sc
from .report import failures, fmt_ms, goodput, lat
from .stack import Stack, Target

# The upstream: ~787 req/s with full batches of 32 (40 ms + 20 us/input, one call at a time).
BASE_MS, PER_INPUT_US = 40, 20
UPSTREAM = f"fake-upstream {BASE_MS} ms + {PER_INPUT_US} us/input, concurrency 1"
STAGGER_S = 0.05
sc.SCENARIOS += [("tenants", "T1. Tenants: a noisy neighbour, and weights 2:1 over capacity")]
sc.SCENARIO_NAMES += ["tenants"]


def capacity(batch: int) -> float:
    return batch / (BASE_MS / 1e3 + batch * PER_INPUT_US / 1e6)


def tenants_file(b: Stack, weights: dict[str, int]) -> str:
    path = b.log_dir / f"tenants-{'-'.join(f'{t}{w}' for t, w in weights.items())}.toml"
    path.write_text("".join(f"[tenants.{t}]\nweight = {w}\n\n" for t, w in weights.items()))
    return str(path)


def as_tenant(target: Target, tenant: str) -> Target:
    return Target(target.path, [*target.args, "--tenant", tenant])


def together(b: Stack, loads: list[tuple[str, Target, float]], warmup: float,
             duration: float, workers: list) -> dict[str, dict]:
    """Runs one load generator per (label, target, rate) at once; their reports by label."""
    out: dict = {}

    def one(label: str, target: Target, rate: float) -> None:
        try:
            out[label] = b.load(label, target, rate=rate, warmup=warmup, duration=duration,
                                timeout=sc.TIMEOUT_S, workers=workers)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out[label] = e

    threads = []
    for label, target, rate in loads:
        t = threading.Thread(target=one, args=(label, target, rate))
        t.start()
        threads.append(t)
        time.sleep(STAGGER_S)
    for t in threads:
        t.join()
    for label, value in out.items():
        if isinstance(value, BaseException):
            raise value
    return out


def phase(b: Stack, weights: dict[str, int], loads: list[tuple[str, str, float]],
          warmup: float, duration: float) -> list[dict]:
    """One worker with `weights`, the loads (label, tenant, rate) at once; run entries."""
    mark = b.sup.mark()
    try:
        nats = b.nats()
        _, up = b.fake_upstream(BASE_MS, PER_INPUT_US, 1)
        worker = b.worker(nats, tei_url=up, CACHE="false",
                          TENANTS_FILE=tenants_file(b, weights))
        b.wait_workers(nats, [worker])
        loadavg = os.getloadavg()[0]
        reports = together(b, [(label, as_tenant(nats.target(), tenant), rate)
                               for label, tenant, rate in loads], warmup, duration, [worker])
    finally:
        b.sup.stop_since(mark)
    return [sc.run_entry(label, {"tenant": tenant, "rate": rate, "weights": weights,
                                 "loadavg_before": loadavg}, reports[label])
            for label, tenant, rate in loads]


def scenario_tenants(b: Stack) -> dict:
    cap = capacity(b.defaults.max_batch_size)
    light, heavy = round(0.2 * cap), round(3 * cap)
    warmup, duration = b.d(2, 1), b.d(15, 4)
    even = {"a": 1, "b": 1}
    runs = phase(b, even, [("b alone", "b", light)], warmup, duration)
    runs += phase(b, even, [("a noisy", "a", heavy), ("b beside a", "b", light)],
                  warmup, duration)
    over = round(1.5 * cap)
    runs += phase(b, {"a": 2, "b": 1}, [("a weight 2", "a", over), ("b weight 1", "b", over)],
                  warmup, duration)
    return {"settings": {"upstream": UPSTREAM, "capacity": cap, "light": light, "heavy": heavy,
                         "over": over, "timeout_s": sc.TIMEOUT_S, "warmup_s": warmup,
                         "duration_s": duration, "worker": {"CACHE": "false"}},
            "runs": runs}


sc.SCENARIO_FUNCS["tenants"] = scenario_tenants


def render_tenants(res: dict, targets: list) -> list[str]:
    """Per run: tenant, weights, offered rate, goodput, p50/p99, failures; then the checks of
    the noisy-neighbour benchmark (B's share of what it offered, its p99 against alone, A's share
    of the rest, the 2:1 ratio)."""
    s = res["settings"]
    out = [f"One worker on a {UPSTREAM} (full-batch capacity ~{s['capacity']:,.0f} req/s), "
           f"CACHE off, tenants from a tenants file; open loop on NATS with `Embatch-Tenant` "
           f"(`embatch-loadtest run --nats --tenant`), distinct single inputs, "
           f"{s['warmup_s']:g} s warm-up, {s['duration_s']:g} s measured, {s['timeout_s']:g} s "
           f"timeout. Load average: the 1-minute one when the phase started.", "",
           "| run | tenant | weights | offered req/s | load avg | goodput req/s | p50 ms | "
           "p99 ms | failures |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    by = {run["label"]: run for run in res["runs"]}
    for run in res["runs"]:
        r = run["report"]
        weights = ":".join(str(w) for w in run["weights"].values())
        out.append(f"| {run['label']} | {run['tenant']} | {weights} | {run['rate']:,} | "
                   f"{run['loadavg_before']:.2f} | {goodput(r):,.0f} | "
                   f"{fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} |")
    alone, beside, noisy = (by.get(k) for k in ("b alone", "b beside a", "a noisy"))
    if alone and beside and noisy:
        b_share = goodput(beside["report"]) / beside["rate"]
        p99 = lat(beside["report"], "p99_ms") / max(lat(alone["report"], "p99_ms"), 1e-9)
        rest = s["capacity"] - goodput(beside["report"])
        out += ["", f"B beside the noisy A got {b_share:.1%} of what it offered (target "
                    f"≥ 99%), at {p99:.2f}x its p99 alone (target ≤ 1.5x); A got "
                    f"{goodput(noisy['report']) / rest:.1%} of the rest of the capacity "
                    f"(target ≥ 90%)."]
    two, one = by.get("a weight 2"), by.get("b weight 1")
    if two and one and goodput(one["report"]):
        out += [f"Both over capacity with weights 2:1: goodput ratio "
                f"{goodput(two['report']) / goodput(one['report']):.2f} (target 2 ± 10%)."]
    return out


RENDERERS = {"tenants": render_tenants}
SHOWS = {"tenants": "That tenants share one worker fairly: a light tenant beside one that offers "
                    "3x capacity keeps what it offers and its latency, and two tenants over "
                    "capacity share it by weight."}
