"""RESULTS.md: one Markdown section per scenario, rendered from its JSON file, and the table of
targets met or missed. Batching settings come from what each result recorded, not from the
binaries at hand, so old results render as they were measured."""

from __future__ import annotations

import json
from pathlib import Path

from .defaults import parse_duration_ms
from .report import failures, fmt_ms, fmt_rate, goodput, kind_latency, lat, throughput
from .scenarios import (GPU_BASE_MS, GPU_PER_INPUT_US, SCENARIO_NAMES, SCENARIOS, SLOW_BASE_MS,
                        SLOW_PER_INPUT_US, direct_inputs_per_s)


def verdict(ok: bool | None) -> str:
    """None: the runs cannot tell (e.g. pairs of a noisy A/B that disagree)."""
    if ok is None:
        return "**not resolved**"
    return "**met**" if ok else "**missed**"


def find(runs: list[dict], **match) -> dict | None:
    for run in runs:
        if all(run.get(k) == v for k, v in match.items()):
            return run["report"]
    return None


def runs_settings_batch(res: dict) -> tuple[list[dict], dict, int]:
    """A scenario file's runs, its settings and the workers' MAX_BATCH_SIZE (inputs)."""
    s = res["settings"]
    return res["runs"], s, int(s["worker"]["MAX_BATCH_SIZE"])


def p50_p99(r: dict) -> str:
    """The `p50 ms | p99 ms` cells of a report's latency (successful requests)."""
    return f"{fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))}"


def render_gpu_rates(res: dict, targets: list) -> list[str]:
    runs, s, batch = runs_settings_batch(res)
    wait_ms = parse_duration_ms(s["worker"]["MAX_WAIT_TIME"])
    ceiling = s["ceiling"]
    one_ms = GPU_BASE_MS + GPU_PER_INPUT_US / 1e3
    full_ms = GPU_BASE_MS + batch * GPU_PER_INPUT_US / 1e3
    out = [
        f"Fake upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} µs/input, one call at a time; "
        f"one worker (MAX_BATCH_SIZE {batch}, MAX_WAIT_TIME {wait_ms} ms); single-input "
        f"requests, open loop (latency from the scheduled send time), 2 s timeout. Direct "
        f"saturates at 1/{one_ms:.2f} ms ≈ {s['direct_capacity']:.0f} req/s; the ceiling with "
        f"full batches of {batch} is {batch}/{full_ms:.2f} ms ≈ {ceiling:,.0f} req/s. Completed "
        "= answered in any way (including errors) per second; goodput = successes within the "
        "timeout per second; p50/p99 are of the successes.",
        "",
        "| offered req/s | path | completed req/s | goodput req/s | p50 ms | p99 ms | errors |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    rates = sorted({r["rate"] for r in runs})
    for rate in rates:
        for path in ("direct", "gateway", "nats"):
            r = find(runs, rate=rate, path=path)
            if r is None:
                continue
            out.append(f"| {rate:,} | {path} | {fmt_rate(throughput(r))} | {fmt_rate(goodput(r))}"
                       f" | {p50_p99(r)}"
                       f" | {failures(r)} |")
    out.append("")
    for path in ("gateway", "nats"):
        best = None
        for run in runs:
            r = run["report"]
            p99 = lat(r, "p99_ms")
            if (run["path"] == path and goodput(r) >= 0.99 * run["rate"] and p99 is not None
                    and p99 <= 25):
                if best is None or run["rate"] > best[0]:
                    best = (run["rate"], goodput(r), p99)
        if best:
            ok = best[0] >= 0.95 * ceiling
            targets.append((f"1. GPU-like, via {path}: sustains ≥ 95% of the {ceiling:,.0f} "
                            "req/s ceiling with p99 ≤ 25 ms",
                            f"{best[0]:,} req/s offered = {best[0] / ceiling:.1%} of the ceiling "
                            f"(goodput {best[1]:,.0f}, p99 {fmt_ms(best[2])} ms)", ok))
        else:
            targets.append((f"1. GPU-like, via {path}: sustained ≥ 95% of the ceiling with "
                            "p99 ≤ 25 ms", "no rate sustained", False))
    d = [goodput(run["report"]) for run in runs if run["path"] == "direct"]
    if d:
        out.append(f"Direct peaks at {max(d):,.0f} req/s of goodput. \"Sustained\" below means "
                   "goodput ≥ 99% of the offered rate with p99 ≤ 25 ms.")
    return out


def render_low_load(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    s = res["settings"]
    direct = find(runs, path="direct")
    when_idle = str(s.get("worker", {}).get("DISPATCH_WHEN_IDLE", "false")).lower() == "true"
    wait_note = ("with DISPATCH_WHEN_IDLE=true a lone request finds no call in "
                 "flight and leaves at once, so what is added is the pipeline itself"
                 if when_idle else
                 "with DISPATCH_WHEN_IDLE=false a lone request waits MAX_WAIT_TIME for company, "
                 "the price of batching at low load")
    out = [f"Open loop at {s['rate']} req/s (≈ 20, chosen so arrivals are not phase-locked to "
           "the 1 ms timer ticks), GPU-like upstream, MAX_WAIT_TIME "
           f"{s['max_wait_ms']} ms: {wait_note}. The pipeline's own latency is the added p50 "
           "less the worker's mean queue wait.", "",
           "| path | p50 ms | p90 ms | p99 ms | added p50 vs direct | worker queue wait (mean) "
           "| errors |",
           "|---|---:|---:|---:|---:|---:|---|"]
    names = {"relay": "nats, bare relay instead of the worker"}
    for path in ("direct", "gateway", "nats", "relay"):
        r = find(runs, path=path)
        if r is None:
            continue
        added = "-"
        if path != "direct" and direct and lat(r, "p50_ms") is not None:
            added = f"+{lat(r, 'p50_ms') - lat(direct, 'p50_ms'):.2f} ms"
        wait = (r.get("batches") or {}).get("mean_queue_wait_ms")
        wait = "-" if wait is None else f"{wait:.2f} ms"
        out.append(f"| {names.get(path, path)} | {fmt_ms(lat(r, 'p50_ms'))} | "
                   f"{fmt_ms(lat(r, 'p90_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | {added} | {wait} | {failures(r)} |")
    relay = find(runs, path="relay")
    if direct and relay and lat(relay, "p50_ms") is not None:
        out += ["", "The relay row is the NATS path with `embatch-loadtest nats-relay` in the "
                "worker's place: it POSTs each message, unbatched, to the same upstream and "
                "publishes the body to the reply inbox (no validation, admission or batching). "
                "Its added p50 is what the two NATS hops cost on this machine, the floor of any "
                "NATS-based design; the nats row less the relay row is what the worker itself "
                "adds."]
    gw = find(runs, path="gateway")
    if direct and gw and lat(gw, "p50_ms") is not None:
        added = lat(gw, "p50_ms") - lat(direct, "p50_ms")
        limit = s["max_wait_ms"] + 1
        targets.append((f"2. Low load: added p50 of the gateway path ≤ MAX_WAIT_TIME + 1 ms "
                        f"= {limit} ms", f"+{added:.2f} ms", added <= limit))
    # Issue 11: the pipeline's own share: the added p50 less the time the request waited in the
    # worker's queue for batch-mates (MAX_WAIT_TIME, or ~0 when it is sent at once when idle).
    for path, bound in (("nats", 0.3), ("gateway", 0.5)):
        r = find(runs, path=path)
        wait = ((r or {}).get("batches") or {}).get("mean_queue_wait_ms")
        if direct and r and lat(r, "p50_ms") is not None and wait is not None:
            own = lat(r, "p50_ms") - lat(direct, "p50_ms") - wait
            targets.append((f"2. Low load, via {path}: the pipeline's own latency (added p50 "
                            f"less the mean queue wait) ≤ {bound} ms",
                            f"{own:+.2f} ms", own <= bound))
    return out


def render_cpu_model(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    s = res["settings"]
    corpus = Path(s["corpus"]).name if "/" in s["corpus"] else s["corpus"]
    out = [f"Worker with the built-in model (all-MiniLM-L6-v2 on the CPU, no TEI), through the "
           f"gateway, closed loop, inputs from {corpus}, "
           "10 s timeout. The model shares the machine's cores with the gateway, nats-server "
           "and the load generator.", "",
           "| concurrency | throughput req/s | p50 ms | p99 ms | errors |",
           "|---:|---:|---:|---:|---|"]
    for run in runs:
        r = run["report"]
        out.append(f"| {run['concurrency']} | {throughput(r):,.1f} | {fmt_ms(lat(r, 'p50_ms'))} "
                   f"| {fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} |")
    return out


def render_pipeline(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    procs = ["gateway", "worker", "nats-server", "fake-upstream", "loadtest"]
    out = ["Fake upstream that answers at once (0 ms), closed loop with 256 requests in flight, "
           "single-input requests, 384-float vectors: what the pipeline itself can do on this "
           "machine, and the CPU time each process spends per request (utime + stime from "
           "/proc/PID/stat over the run, divided by the requests completed). `direct` sends the "
           "same load to the fake upstream itself: the reference for the other two paths.", "",
           "| path | req/s | % of direct | p50 ms | p99 ms | "
           + " | ".join(f"{p} µs/req" for p in procs) + " | cores busy |",
           "|---|---:|---:|---:|---:|" + "---:|" * len(procs) + "---:|"]
    on_path = {"direct": {"fake-upstream", "loadtest"},
               "nats": {"worker", "nats-server", "fake-upstream", "loadtest"}}
    direct = find(runs, path="direct")
    for run in runs:
        r = run["report"]
        n = max(1, r["requests"]["sent"])
        cpu = r.get("cpu_s", {})
        used = on_path.get(run["path"], set(procs))
        cells = [f"{cpu[p] * 1e6 / n:.0f}" if p in cpu and p in used else "-" for p in procs]
        busy = f"{sum(cpu.values()) / r['cpu_wall_s']:.2f}" if r.get("cpu_wall_s") else "-"
        share = (f"{throughput(r) / throughput(direct):.0%}" if direct and throughput(direct)
                 else "-")
        out.append(f"| {run['path']} | {fmt_rate(throughput(r))} | {share} | "
                   f"{p50_p99(r)} | "
                   + " | ".join(cells) + f" | {busy} |")
    if direct and throughput(direct):
        for path, floor in (("gateway", 0.80), ("nats", 0.90)):
            r = find(runs, path=path)
            if r is not None:
                share = throughput(r) / throughput(direct)
                targets.append((f"4. Instant upstream, via {path}: ≥ {floor:.0%} of the direct "
                                "upstream's req/s",
                                f"{share:.0%} ({fmt_rate(throughput(r))} of "
                                f"{fmt_rate(throughput(direct))} req/s)", share >= floor))
    r = find(runs, path="gateway")
    if r is not None and r.get("cpu_s"):
        n = max(1, r["requests"]["sent"])
        for proc in ("gateway", "worker"):
            us = r["cpu_s"].get(proc, 0) * 1e6 / n
            targets.append((f"4. CPU per request at the ceiling, {proc}: ≤ 12 µs",
                            f"{us:.0f} µs", us <= 12))
    return out


def render_closed_gpu(res: dict, targets: list) -> list[str]:
    runs, s, batch = runs_settings_batch(res)
    out = [f"Fake upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} µs/input, one call at a time "
           f"(ceiling {s['ceiling']:,.0f} req/s with full batches of {batch}); closed loop with "
           f"{s['concurrency']} requests in flight, single-input requests. With 2 × "
           "MAX_BATCH_SIZE in flight the worker can carry two full cohorts or three smaller "
           "ones (slower, shorter batches). When any due batch could take any free call slot, "
           "a split stayed split and runs landed in one mode or the other; a batch that is not "
           "full now waits for the running call (PARTIAL_BATCH_SLOTS, the batching rules of "
           "docs/architecture.md, "
           "point 3), so split cohorts merge back into full batches. Mean batch = inputs per "
           "upstream call over the measured window.", "",
           "| path | req/s | % of nats | mean batch | p50 ms | p99 ms | errors |",
           "|---|---:|---:|---:|---:|---:|---|"]
    nats = find(runs, path="nats")
    for run in runs:
        r = run["report"]
        mb = (r.get("batches") or {}).get("mean_batch_inputs")
        share = (f"{throughput(r) / throughput(nats):.1%}"
                 if nats and throughput(nats) and run["path"] != "direct" else "-")
        out.append(f"| {run['path']} | {fmt_rate(throughput(r))} | {share} | "
                   f"{'-' if mb is None else f'{mb:.1f}'} | {p50_p99(r)}"
                   f" | {failures(r)} |")
    gw = find(runs, path="gateway")
    if gw and nats and throughput(nats):
        share = throughput(gw) / throughput(nats)
        targets.append(("13. GPU-like, closed loop c=64, via gateway: ≥ 98% of NATS direct",
                        f"{share:.1%}", share >= 0.98))
        mb = (gw.get("batches") or {}).get("mean_batch_inputs")
        if mb is not None:
            targets.append(("13. GPU-like, closed loop c=64, via gateway: mean batch ≥ 31.5",
                            f"{mb:.1f}", mb >= 31.5))
    return out


def render_scaling(res: dict, targets: list) -> list[str]:
    runs, s, batch = runs_settings_batch(res)
    out = [f"Each worker has its own fake upstream ({SLOW_BASE_MS} ms + {SLOW_PER_INPUT_US} "
           f"µs/input, one call at a time: ≈ {s['per_worker_capacity']:.0f} req/s per worker at "
           f"batch {batch}); load through the gateway, closed loop with 160 requests in flight "
           "per worker, 10 s timeout.", "",
           "| workers | throughput req/s | × one worker | p50 ms | p99 ms | errors |",
           "|---:|---:|---:|---:|---:|---|"]
    one = find(runs, workers=1)
    for run in runs:
        r = run["report"]
        x = f"{goodput(r) / goodput(one):.2f}×" if one and goodput(one) > 0 else "-"
        out.append(f"| {run['workers']} | {fmt_rate(goodput(r))} | {x} | "
                   f"{p50_p99(r)} | {failures(r)} |")
    four = find(runs, workers=4)
    if one and four and goodput(one) > 0:
        x = goodput(four) / goodput(one)
        targets.append(("5. Scaling: 4 workers ≥ 3.5× one worker", f"{x:.2f}×", x >= 3.5))
    return out


def render_tuning(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    s = res["settings"]
    out = [f"GPU-like upstream, open loop at {s['rate']:,} req/s through the gateway, single-input "
           "requests. Mean batch = inputs per upstream call, from the worker's "
           "`embatch_worker_batch_inputs` histogram over the measured window.", "",
           "| MAX_WAIT_TIME | MAX_BATCH_SIZE | goodput req/s | p50 ms | p99 ms | mean batch "
           "| upstream calls/s | mean queue wait ms | errors |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        r = run["report"]
        b = r.get("batches") or {}
        mb, calls = b.get("mean_batch_inputs"), b.get("upstream_calls_per_s")
        out.append(f"| {run['max_wait_ms']} ms | {run['max_batch_size']} | "
                   f"{fmt_rate(goodput(r))} | {p50_p99(r)}"
                   f" | {'-' if mb is None else f'{mb:.1f}'} | "
                   f"{fmt_rate(calls)} | {fmt_ms(b.get('mean_queue_wait_ms'))} | {failures(r)} |")
    return out


OVERLOAD_HEADER = ["| upstream | path | capacity req/s | offered req/s | goodput req/s | "
                   "goodput / capacity | success p99 ms | 429s | 429 p99 ms | errors |",
                   "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]


def overload_rows(runs: list, targets: list, label: str, goodput_target: float) -> list[str]:
    """The rows of an overload table (`overload_runs`), and its targets under `label`: goodput
    of at least `goodput_target` of capacity, 429 p99 ≤ 50 ms, success p99 < 2 s."""
    out = list(OVERLOAD_HEADER)
    for run in runs:
        r = run["report"]
        cap = run["capacity"]
        n429 = (r.get("failures") or {}).get("429", 0)
        up = "GPU-like" if run["upstream"] == "gpu" else "CPU model"
        path = "direct" if run["path"] == "direct" else "embatch (gateway)"
        rej = kind_latency(r, "429", "p99_ms")
        if run.get("skipped"):
            out.append(f"| {up} | {path} | 0 (closed loop c=128: no success) | not offered | - | - "
                       f"| - | {n429:,} | {fmt_ms(rej)} | {failures(r)} (capacity run) |")
            targets.append((f"{label}, {up}", "no success in the capacity run, 2x not offered",
                            False))
            continue
        ratio = goodput(r) / cap if cap else 0
        p99 = lat(r, "p99_ms")
        out.append(f"| {up} | {path} | {fmt_rate(cap)} | {fmt_rate(run['rate'])} | "
                   f"{fmt_rate(goodput(r))} | {ratio:.0%} | {fmt_ms(p99)} | "
                   f"{n429:,} | {fmt_ms(rej)} | {failures(r)} |")
        if run["path"] == "gateway":
            targets.append((f"{label}, {up}: goodput ≥ {goodput_target:.0%} of capacity",
                            f"{ratio:.0%} ({fmt_rate(goodput(r))} of {fmt_rate(cap)} req/s)",
                            ratio >= goodput_target))
            targets.append((f"{label}, {up}: p99 of 429 rejections ≤ 50 ms",
                            f"{fmt_ms(rej)} ms ({n429:,} rejections)",
                            rej is not None and rej <= 50))
            targets.append((f"{label}, {up}: p99 of successes < 2 s", f"{fmt_ms(p99)} ms",
                            p99 is not None and p99 < 2000))
    return out


def render_overload(res: dict, targets: list) -> list[str]:
    intro = ["Open loop at twice the capacity measured just before (closed loop, same stack), 2 s "
             "client timeout, gateway REQUEST_TIMEOUT 2 s. Goodput counts successes within 2 s; "
             "an answer later than 2 s is a `timeout`, so the p99 of successes cannot exceed 2 s "
             "and the timeouts and 504s show work done too late.",
             ""]
    return intro + overload_rows(res["runs"], targets, "7. Overload", 0.9)


def render_tei_client_defaults(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    d = s.get("binary_defaults", {})
    gw_timeout = (d.get("gateway") or {}).get("REQUEST_TIMEOUT", "?")
    worker_d = d.get("worker") or {}
    intro = ["Gateway and worker on their defaults: no `x-embatch-timeout-ms` header, no "
             f"REQUEST_TIMEOUT (default {gw_timeout}), no worker settings but the upstream "
             f"(MAX_CONCURRENT_BATCHES {worker_d.get('MAX_CONCURRENT_BATCHES', '?')}, QUEUE_CAP "
             f"{worker_d.get('QUEUE_CAP', '?')}, MAX_QUEUE_DELAY "
             f"{worker_d.get('MAX_QUEUE_DELAY', '?')}). The client is like a TEI/OpenAI client: "
             "its own 2 s timeout, no deadline sent. Open loop at twice the capacity measured "
             "just before (closed loop, same stack: direct c=8, embatch c=512 on the GPU-like "
             "upstream, c=128 on the CPU model). Goodput = successes within 2 s per second. The "
             "direct row is the same 2x overload against the fake upstream alone (what TEI alone "
             "does).",
             ""]
    return intro + overload_rows(res["runs"], targets,
                                 "8. Defaults, TEI client, 2x overload", 0.85)


def render_slow_then_fast(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    rec = res.get("recovery") or {}
    run = res["runs"][0]
    r = run["report"]
    ps = r.get("per_second") or {}
    good = ps.get("goodput") or []
    window = int(s["duration_s"])
    offsets = rec.get("second_offsets_s") or []
    after = set(rec.get("seconds_after_switch") or [])
    rate = s["rate"]
    cells = []
    for i, n in enumerate(good[:window]):
        mark = "**|** " if after and i == min(after) else ""
        cells.append(f"{mark}{n:,}")
    n429 = (r.get("failures") or {}).get("429", 0)
    first_after = offsets[min(after)] if after and offsets else None
    out = [f"GPU-like upstream ({GPU_BASE_MS} ms + {GPU_PER_INPUT_US} µs/input, one call at a "
           f"time) whose calls take {s['slow_delay_s']} s more during its first "
           f"{s['slow_for_s']} s (`fake-upstream --slow-for {s['slow_for_s']}s --slow-delay "
           f"{s['slow_delay_s']}s`; a call that arrived before the switch keeps its delay). "
           f"Gateway and worker on their defaults, open loop at {rate:,} req/s (50% of the "
           f"{s['fast_ceiling']:,.0f} req/s ceiling) through the gateway for {window} s, client "
           "timeout 2 s, no deadline sent. The load starts so that one of the load generator's "
           "seconds begins at the switch. Recovery = from the switch to the end of the last "
           f"second after it whose goodput was below {rec.get('recovered_share', 0.95):.0%} of "
           "the offered rate (every later second of the run was at the offered rate), at "
           "one-second resolution; \"< 1 s\" when no second after the switch was below.",
           "",
           "| offered req/s | recovery after the switch | goodput req/s (whole run) | success "
           "p99 ms | 429s | 429 p99 ms | errors |",
           "|---:|---:|---:|---:|---:|---:|---|",
           f"| {rate:,} | {fmt_recovery(rec)} | {fmt_rate(goodput(r))} | "
           f"{fmt_ms(lat(r, 'p99_ms'))} | {n429:,} | "
           f"{fmt_ms(kind_latency(r, '429', 'p99_ms'))} | {failures(r)} |",
           "",
           "Goodput per second (successes within 2 s completed in that second; **|** = the first "
           "second after the switch"
           + (f", which began {first_after * 1e3:+.0f} ms from it" if first_after is not None
              else "") + "): " + ", ".join(cells) + "."]
    rs = rec.get("recovery_s")
    targets.append(("9. Slow then fast: goodput back to the offered rate ≤ 2 s after the switch",
                    fmt_recovery(rec), rs is not None and rs <= 2))
    return out


def fmt_recovery(rec: dict) -> str:
    x = rec.get("recovery_s")
    if x is None:
        return "not within the run"
    if not rec.get("seconds_below"):
        return "< 1 s"
    return f"{x:.2f} s"


def failed_share(r: dict) -> float:
    """Failed requests (any kind, not_sent included) over all requests of the window."""
    req = r["requests"]
    n = req["succeeded"] + req["failed"]
    return req["failed"] / n if n else 0.0


def failure_lat(r: dict, key: str) -> float | None:
    """A latency of the failures that reached the target (`max_ms`: the worst; absent from
    reports of loadtests older than it)."""
    return (r.get("error_latency") or {}).get(key)


def when_label(run: dict) -> str:
    return f"{run['when']}: `MEMBERSHIP={run['membership']}`"


def membership_intro(s: dict) -> str:
    return ("Each run has a stack of its own; before = every worker with `MEMBERSHIP=static` "
            "(always a member of the queue group, the old behaviour), after = "
            "`MEMBERSHIP=adaptive` (a worker leaves the queue group while its upstream is "
            "unhealthy or its backlog is long, and rejoins). Gateway REQUEST_TIMEOUT "
            f"{s['timeout_s']} s, client timeout {s['timeout_s']} s, single-input requests, open "
            f"loop (latency from the scheduled send time), {s['warmup_s']:g} s warm-up, "
            f"{s['duration_s']:g} s measured. Goodput = successes within the timeout per "
            "second; p50/p99 are of the successes; failure latencies are of the failed requests "
            "that reached the gateway.")


def membership_target(runs: list[dict], label: str, value, fmt, ok) -> tuple | None:
    """A target judged on the "after" run, its measured value followed by the "before" one."""
    after = next((run for run in runs if run["when"] == "after"), None)
    before = next((run for run in runs if run["when"] == "before"), None)
    if after is None:
        return None
    v = value(after["report"], after)
    text = fmt(v)
    if before is not None:
        text += f" (before: {fmt(value(before['report'], before))})"
    return (label, text, v is not None and ok(v))


def worker_cell(b: dict | None) -> str:
    if not b or b.get("mean_batch_inputs") is None:
        return "-" if b is None else "0 calls"
    return (f"{b['inputs']:,.0f} inputs in {b['upstream_calls']:,.0f} calls, batch "
            f"{b['mean_batch_inputs']:.1f}, {b['upstream_calls_per_s']:,.0f} calls/s")


def render_uneven_workers(res: dict, targets: list) -> list[str]:
    runs, s, batch = runs_settings_batch(res)
    cap = s["capacity"]
    rate = s["rate"]
    out = [f"Worker A on {s['upstreams']['A']} (≈ {cap['A']:,.0f} req/s at batch {batch}), "
           f"worker B on {s['upstreams']['B']} (5x slower, ≈ {cap['B']:,.0f} req/s); open "
           f"loop at {rate:,} req/s through the gateway: {rate / (cap['A'] + cap['B']):.0%} of "
           f"their joint capacity, but an even split would send B {rate / 2:,.0f} req/s, "
           f"{rate / 2 / cap['B']:.1f}x its capacity. "
           + membership_intro(s) + " Per worker: the inputs of its upstream calls in the "
           "measured window, mean inputs per call and calls per second (its metrics).", "",
           "| run | offered req/s | goodput req/s | of offered | success p50 ms | success p99 ms "
           "| worst failure ms | failures | worker A | worker B |",
           "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for run in runs:
        r = run["report"]
        by_worker = r.get("batches_by_worker") or [None, None]
        out.append(f"| {when_label(run)} | {fmt_rate(run['rate'])} | {fmt_rate(goodput(r))} | "
                   f"{goodput(r) / run['rate']:.1%} | {p50_p99(r)}"
                   f" | {fmt_ms(failure_lat(r, 'max_ms'))} | "
                   f"{failures(r)} | {worker_cell(by_worker[0])} | {worker_cell(by_worker[1])} |")
    for t in (
        membership_target(runs, f"10. Uneven workers, adaptive: goodput ≥ 97% of the {rate:,} "
                                "req/s offered", lambda r, run: goodput(r) / run["rate"],
                          lambda v: f"{v:.1%}", lambda v: v >= 0.97),
        membership_target(runs, "10. Uneven workers, adaptive: p99 of successes < 1 s",
                          lambda r, run: lat(r, "p99_ms"), lambda v: f"{fmt_ms(v)} ms",
                          lambda v: v < 1000),
    ):
        if t:
            targets.append(t)
    return out


def kill_rows(res: dict, targets: list, label: str) -> list[str]:
    """The table of a kill_during_load scenario, its goodput per second, and its target under
    `label`: at most 1% of the requests failed with `MEMBERSHIP=adaptive`."""
    runs = res["runs"]
    s = res["settings"]
    window = int(s["duration_s"])
    out = [f"Two equal workers, A and B, each on its own GPU-like fake upstream ({GPU_BASE_MS} "
           f"ms + {GPU_PER_INPUT_US} µs/input, one call at a time); open loop at "
           f"{s['rate']:,} req/s through the gateway; {s['kill_at_s']:g} s into the measured "
           f"window, SIGKILL of {s['victim']}, left down for the rest of the run. "
           + membership_intro(s), "",
           "| run | offered req/s | requests | goodput req/s | of offered | failed | failures "
           "| failure p50 ms | worst failure ms | success p99 ms | killed at |",
           "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for run in runs:
        r = run["report"]
        req = r["requests"]
        killed = run.get("kill_offset_s")
        out.append(f"| {when_label(run)} | {fmt_rate(run['rate'])} | "
                   f"{req['succeeded'] + req['failed']:,} | {fmt_rate(goodput(r))} | "
                   f"{goodput(r) / run['rate']:.1%} | {req['failed']:,} "
                   f"({failed_share(r):.2%}) | {failures(r)} | "
                   f"{fmt_ms(failure_lat(r, 'p50_ms'))} | {fmt_ms(failure_lat(r, 'max_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | "
                   f"{'-' if killed is None else f'+{killed:.2f} s'} |")
    out += ["", "Goodput per second of the measured window (successes within the timeout "
                "completed in that second; **×** = the second of the kill):", ""]
    for run in runs:
        r = run["report"]
        good = ((r.get("per_second") or {}).get("goodput") or [])[:window]
        killed = run.get("kill_offset_s")
        at = int(killed) if killed is not None else None
        cells = [f"{'**×** ' if i == at else ''}{n:,}" for i, n in enumerate(good)]
        out.append(f"- {when_label(run)}: " + (", ".join(cells) or "-"))
    t = membership_target(runs, f"{label}, adaptive: ≤ 1% of the requests failed",
                          lambda r, run: failed_share(r), lambda v: f"{v:.2%}",
                          lambda v: v <= 0.01)
    if t:
        targets.append(t)
    return out


def render_sick_upstream(res: dict, targets: list) -> list[str]:
    return kill_rows(res, targets, "11. Sick upstream")


def render_worker_kill(res: dict, targets: list) -> list[str]:
    return kill_rows(res, targets, "12. Worker killed")


RENDERERS = {
    "gpu_rates": render_gpu_rates,
    "low_load": render_low_load,
    "cpu_model": render_cpu_model,
    "pipeline": render_pipeline,
    "scaling": render_scaling,
    "tuning": render_tuning,
    "overload": render_overload,
    "tei_client_defaults": render_tei_client_defaults,
    "slow_then_fast": render_slow_then_fast,
    "uneven_workers": render_uneven_workers,
    "sick_upstream": render_sick_upstream,
    "worker_kill": render_worker_kill,
    "closed_gpu": render_closed_gpu,
}


# What each scenario shows, in one sentence, and the charts drawn from it (charts.py).
def machine_line(info: dict) -> str:
    """`2 cores (CPU model), Linux x.y`: a machine as the docs name it, from `machine.json` or
    a scenario's own record."""
    return f"{info.get('cores', '?')} cores ({info.get('cpu', '?')}), {info.get('kernel', '?')}"


SHOWS = {
    "gpu_rates": "How far one worker carries a GPU-like upstream as the offered load rises, "
                 "against the upstream called without batching.",
    "low_load": "What the pipeline adds to a lone request when there is nothing to batch.",
    "cpu_model": "The built-in CPU model end to end: a stack that needs no GPU and no TEI.",
    "pipeline": "The pipeline's own ceiling and the CPU each process spends per request, with an "
                "upstream that costs nothing.",
    "scaling": "That throughput grows with the number of workers, each with its own upstream.",
    "tuning": "What MAX_WAIT_TIME and MAX_BATCH_SIZE change at a fixed load below saturation.",
    "overload": "Goodput at twice the capacity: load shedding keeps the upstream on requests "
                "that can still succeed, where the upstream alone answers nothing in time.",
    "tei_client_defaults": "The same overload with every setting at its default and a client "
                           "that sends no deadline.",
    "slow_then_fast": "How fast goodput comes back after the upstream has been slow.",
    "uneven_workers": "Whether adaptive membership sends the load to the worker that has room.",
    "sick_upstream": "What a dead upstream behind one of two workers costs, static against "
                     "adaptive membership.",
    "worker_kill": "What a worker killed with SIGKILL costs (measured before the client "
                   "resent what a killed worker held; see scenario 14).",
    "closed_gpu": "That the HTTP and NATS paths fill batches alike under a closed loop.",
    "indexing": "That a client posting 512-input chunks with long deadlines is served at the "
                "upstream's full-batch rate, not shed, with every setting at its default.",
    "recovery_worker_kill": "That the requests a killed worker held are resent and answered, "
                            "with every setting and the gateway's timeout at their defaults.",
    "recovery_churn": "That a worker leaving and rejoining the queue group over and over loses "
                      "no request.",
    "recovery_nats_restart": "What a nats-server restart costs the requests in flight and those "
                             "that arrive while it is down.",
    "recovery_upstream_stop": "That the requests a worker held when its upstream died go to the "
                              "other worker.",
    "token_batching": "What batches sized by a token budget and shaped by length gain over "
                      "batches by input counts on a mixed-length corpus: on padded upstreams "
                      "(the built-in model, a double grouping by 4 as TEI on CPU) and on an "
                      "unpadded GPU-like one.",
}
CHARTS = {
    "gpu_rates": [("goodput_vs_offered.svg", "Goodput against offered load"),
                  ("latency_vs_offered.svg", "p50 and p99 against offered load")],
    "pipeline": [("pipeline_cpu.svg", "CPU per request by process")],
    "tuning": [("batch_size.svg", "Mean inputs per upstream call")],
    "overload": [("overload_over_time.svg", "Overload at 2x capacity, per second")],
    "slow_then_fast": [("recovery.svg", "Goodput per second around the switch")],
    "worker_kill": [("failover.svg", "Goodput per second, static against adaptive membership")],
}


def render(out_dir: Path, provenance: bool = True, charts: str = "charts") -> str:
    """The Markdown of every scenario present in out_dir. `provenance`: each run's date and
    commit (RESULTS.md, next to the JSON), or not (docs/benchmarks.md, which names the command
    and the machine only). `charts`: the charts' directory relative to the written file; a chart
    is linked only if charts.py has drawn it."""
    results = {}
    for name in SCENARIO_NAMES:
        path = out_dir / f"{name}.json"
        if path.is_file():
            results[name] = json.loads(path.read_text())
    meta = json.loads((out_dir / "machine.json").read_text()) if (
        out_dir / "machine.json").is_file() else {}
    targets: list = []
    sections: list[str] = []
    for name, title in SCENARIOS:
        sections += ["", f"### {title}", "", f"**Shows:** {SHOWS[name]}", "",
                     f"**Reproduce:** `python3 loadtest/bench.py --only {name}`", ""]
        res = results.get(name)
        if res is None:
            sections.append("_Not run._")
            continue
        sections += RENDERERS[name](res, targets)
        for file, alt in CHARTS.get(name, []):
            if (out_dir / "charts" / file).is_file():
                sections += ["", f"![{alt}]({charts}/{file})"]
        when = f"Measured {res['started']}, load" if provenance else "Load"
        if res.get("machine") and meta and res["machine"] != machine_line(meta):
            sections += ["", f"_Machine: {res['machine']}, not the one named above._"]
        build = f"Build {res['commit']}; " if res.get("commit") else ""
        sections += ["", f"_{build}{when[0].lower() + when[1:] if build else when} average "
                         f"{res['loadavg_before']:.2f} before the scenario, "
                         f"{res['wall_s']:.0f} s; command `{res.get('command', '?')}`._"]
    machine = (f"Machine: {meta.get('cores', '?')} cores ({meta.get('cpu', '?')}), "
               f"{meta.get('kernel', '?')}")
    if provenance:
        machine += (f"; {meta.get('date', '?')}; 1-minute load average "
                    f"{meta.get('loadavg_start', 0):.2f} at the start; commit "
                    f"{meta.get('commit', '?')}")
    previous = meta.get("previous")
    lines = ["## Benchmarks", "", machine + ".", "",
             f"Command: `{meta.get('command', 'python3 loadtest/bench.py')}` "
             "(raw JSON: `loadtest/results/<scenario>.json`)"
             + (f"; sections not rerun come from `{previous.get('command')}`"
                + (f" ({previous.get('date')})" if provenance else "") if previous else "")
             + ".", "",
             "Everything runs on one machine: the load generator, nats-server, the gateway, "
             "the worker(s) and the upstream share its cores, so CPU-bound numbers are lower "
             "bounds of what separate machines would do.", "",
             "| target | measured | |", "|---|---|---|"]
    for label, value, ok in targets:
        lines.append(f"| {label} | {value} | {verdict(ok)} |")
    return "\n".join(lines + sections) + "\n"


def render_recovery(res: dict, targets: list) -> list[str]:
    """A recovery scenario: per run, failures (client timeouts included) and latencies; the
    target is 0 failures in every run."""
    s = res["settings"]
    out = [f"Two workers, each on its own GPU-like fake upstream ({GPU_BASE_MS} ms + "
           f"{GPU_PER_INPUT_US} µs/input, one call at a time), every setting at its default "
           f"(the gateway's REQUEST_TIMEOUT too); open loop at {s['rate']:,} req/s through the "
           f"gateway, client timeout {s['timeout_s']} s.", "",
           "| run | requests | failed | failures | success p50 ms | p99 ms | max ms | events |",
           "|---|---:|---:|---|---:|---:|---:|---|"]
    for run in res["runs"]:
        r = run["report"]
        req = r["requests"]
        events = "; ".join(f"{e['name']} at +{e['offset_s']:.2f} s"
                           for e in run.get("events") or [] if e.get("offset_s") is not None)
        if len(run.get("events") or []) > 4:
            events = f"{len(run['events'])} events"
        out.append(f"| {run['case']} | {req['succeeded'] + req['failed']:,} | {req['failed']:,} "
                   f"| {failures(r)} | {p50_p99(r)} "
                   f"| {fmt_ms(lat(r, 'max_ms'))} | {events} |")
        targets.append((f"recovery, {run['case']}: 0 failures", f"{req['failed']:,}",
                        req["failed"] == 0))
    return out


def render_indexing(res: dict, targets: list) -> list[str]:
    """The indexing client, a row per vector size: goodput in inputs/s as a share of the
    full-batch ceiling, and 429s; the target is >= 95% of the ceiling and no 429 for each."""
    s = res["settings"]
    out = [f"Closed loop through the gateway: {s['in_flight']} requests of {s['inputs']} inputs "
           f"in flight, the gateway's default REQUEST_TIMEOUT as their deadline; one worker with "
           f"every setting at its default on {s['upstream']}; nats-server with max_payload 8MB "
           f"(as nats/nats.conf).", "",
           "| vector dims | requests | succeeded | failures | goodput inputs/s | share of the "
           "full-batch ceiling | p50 ms | p99 ms |",
           "|---:|---:|---:|---|---:|---:|---:|---:|"]
    # Runs of the upstream called directly with full batches (results from before they were
    # measured have none): the machine's real full-batch rate, per vector size.
    direct = {run.get("dim", 384): direct_inputs_per_s(run["report"], run["inputs"])
              for run in res["runs"] if run.get("path") == "direct"}
    runs = [run for run in res["runs"] if run.get("path") != "direct"]
    for run in runs:
        r = run["report"]
        req = r["requests"]
        dim = run.get("dim", 384)  # results from before the size was recorded used 384
        shed = (r.get("failures") or {}).get("429", 0)
        inputs_s = goodput(r) * s["inputs"]
        share = inputs_s / s["ceiling_inputs_per_s"]
        measured = (f" ({inputs_s / direct[dim]:.0%} of the {direct[dim]:,.0f} measured "
                    "directly)" if direct.get(dim) else "")
        out.append(f"| {dim} | {req['sent']:,} | {req['succeeded']:,} | {failures(r)} | "
                   f"{inputs_s:,.0f} | {share:.0%} of {s['ceiling_inputs_per_s']:,.0f}{measured}"
                   f" | {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} |")
        targets.append((f"indexing client, {dim} dims: goodput >= 95% of the full-batch "
                        "ceiling", f"{share:.0%}", share >= 0.95))
        targets.append((f"indexing client, {dim} dims: no 429", f"{shed:,}", shed == 0))
    out += indexing_cpu(runs)
    if direct:
        out += ["", "Measured directly: the same upstream called by the load generator with "
                    "full batches of its own (two requests in flight, one waiting at the "
                    "simulated GPU), the best any batcher could do on this machine; the "
                    "full-batch ceiling counts the upstream's sleep alone."]
    return out


def indexing_cpu(runs: list) -> list[str]:
    """Where the machine's cores went in each indexing run (CPU seconds per wall second, by
    process) and how fast the upstream was called; empty for results without them."""
    rows = [r for r in runs if r["report"].get("cpu_s") and r["report"].get("cpu_wall_s")]
    if not rows:
        return []
    names = ("loadtest", "gateway", "worker", "nats-server", "fake-upstream")
    out = ["", "Cores busy over each run (CPU seconds per second of the run, by process) and the "
               "upstream calls the worker made:", "",
           "| vector dims | " + " | ".join(names) + " | all | upstream calls/s | mean call "
           "(as the worker timed it) |",
           "|---:|" + "---:|" * (len(names) + 3)]
    for run in rows:
        r = run["report"]
        cores = {n: r["cpu_s"].get(n, 0.0) / r["cpu_wall_s"] for n in names}
        st = r.get("batches") or {}
        calls = st.get("upstream_calls_per_s")
        call_ms = st.get("mean_upstream_call_ms")
        out.append(f"| {run.get('dim', 384)} | "
                   + " | ".join(f"{cores[n]:.2f}" for n in names)
                   + f" | {sum(cores.values()):.2f} | "
                   + ("-" if calls is None else f"{calls:.0f}") + " | "
                   + ("-" if call_ms is None else f"{call_ms:.1f} ms") + " |")
    return out


RENDERERS["indexing"] = render_indexing
RENDERERS.update({name: render_recovery for name in (
    "recovery_worker_kill", "recovery_churn", "recovery_nats_restart", "recovery_upstream_stop")})


def render_token_batching(res: dict, targets: list) -> list[str]:
    """Token batching against count batching on a mixed-length corpus: per part (upstream), every
    run's goodput (inputs/s: single-input requests), p50/p99, mean batch and padding ratio; the
    targets compare the modes round by round (adjacent runs of one run of the bench)."""
    s = res["settings"]
    titles = {
        "builtin": "Built-in model (all-MiniLM-L6-v2 on CPU, pads each batch to its longest)",
        "padded_double": f"Padded upstream double: {s['padded_upstream']}",
        "unpadded_double": f"GPU-like unpadded upstream double: {s['unpadded_upstream']}",
    }
    cpu = (s.get("workers") or {}).get("builtin", {}).get("count", {})
    out = [f"Corpus `{s['corpus']}` (85% short queries, 13.5% paragraphs, 1.5% over the built-in "
           f"model's 256-token limit), one input per request over NATS direct with "
           f"`\"truncate\": true`; closed loop with {s['in_flight']} in flight, then open loop "
           f"at {s['open_share']:.0%} of each mode's capacity (its best closed-loop goodput), "
           f"both modes at both rates; "
           f"count = `BATCH_COST=inputs` (batches by input counts), tokens "
           f"= the defaults (`BATCH_COST=auto`, `MAX_BATCH_TOKENS` from the upstream), a fresh "
           f"worker per run, the modes alternating (in reverse order every other round), "
           f"{s['rounds']} round(s). Token counts and "
           f"the padding ratio are the worker's (its estimate from bytes without a tokenizer)."
           + (f" The built-in model's workers run with MAX_QUEUE_DELAY "
              f"{cpu['MAX_QUEUE_DELAY']} in both modes, so the closed loop measures throughput "
              f"rather than load shedding." if cpu.get("MAX_QUEUE_DELAY") else ""),
           ""]
    by_part: dict[str, list[dict]] = {}
    for run in res["runs"]:
        by_part.setdefault(run["part"], []).append(run)
    for part, runs in by_part.items():
        timing = (s.get("workers") or {}).get(part, {}).get("timing") or {}
        when = (f" ({timing['warmup_s']:g} s warm-up, {timing['duration_s']:g} s measured, "
                f"timeout {timing['timeout_s']:g} s)" if timing else "")
        out += [f"**{titles.get(part, part)}**{when}", "",
                "| load | round | mode | inputs/s | p50 ms | p99 ms | failures | mean batch "
                "inputs | padding ratio |",
                "|---|---:|---|---:|---:|---:|---|---:|---:|"]
        for run in runs:
            r = run["report"]
            bt = r.get("batches") or {}
            load = run["load"] + (f" {run['rate']:,.0f}/s" if run.get("rate") else "")
            if run.get("at"):
                load += f" ({s['open_share']:.0%} of {run['at']})"
            mean = bt.get("mean_batch_inputs")
            ratio = bt.get("padding_ratio")
            out.append(f"| {load} | {run['round'] + 1} | {run['mode']} | {fmt_rate(goodput(r))} "
                       f"| {p50_p99(r)} | {failures(r)} "
                       f"| {mean:.1f} | {ratio:.2f} |" if mean is not None and ratio is not None
                       else f"| {load} | {run['round'] + 1} | {run['mode']} "
                            f"| {fmt_rate(goodput(r))} | {p50_p99(r)} | {failures(r)} | | |")
        out.append("")

        def pairs(load: str, **match) -> list[tuple[dict, dict]]:
            rounds = sorted({run["round"] for run in runs if run["load"] == load})
            found = []
            for rnd in rounds:
                c = find(runs, load=load, round=rnd, mode="count", **match)
                t = find(runs, load=load, round=rnd, mode="tokens", **match)
                if c is not None and t is not None:
                    found.append((c, t))
            return found

        closed = pairs("closed")
        if closed:
            ratios = [goodput(t) / goodput(c) for c, t in closed if goodput(c) > 0]
            if ratios:
                span = f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 \
                    else f"{ratios[0]:.2f}×"
                if part == "unpadded_double":
                    targets.append((f"19. {part}: token batching keeps ≥ 97% of count "
                                    "batching's goodput (closed loop)", span,
                                    min(ratios) >= 0.97))
                else:
                    targets.append((f"19. {part}: token batching ≥ 1.5× count batching's "
                                    "inputs/s (closed loop)", span, min(ratios) >= 1.5))
            fills = [(t.get("batches") or {}).get("padding_ratio") for _, t in closed]
            fills = [f for f in fills if f is not None]
            if fills and part != "unpadded_double":
                targets.append((f"19. {part}: padding ratio of token batching ≥ 0.8",
                                ", ".join(f"{f:.2f}" for f in fills), min(fills) >= 0.8))
        # Open loop at the same offered rate, for each of the two rates: at 80% of count
        # batching's capacity both modes keep up, and p99 is compared (the worst over the rounds,
        # on a noisy machine); at 80% of token batching's capacity, inputs/s are compared.
        def same_rate(at: str) -> list[tuple[dict, dict]]:
            return pairs("open", at=at)

        low = same_rate("count")
        if low:
            p99c = [lat(c, "p99_ms") for c, _ in low]
            p99t = [lat(t, "p99_ms") for _, t in low]
            ok = None not in p99c + p99t and max(p99t) <= max(p99c)
            targets.append((f"19. {part}: open loop at {s['open_share']:.0%} of count batching's "
                            "capacity, p99 of token batching no worse (worst over the rounds)",
                            f"{fmt_ms(min(p99t))}–{fmt_ms(max(p99t))} vs "
                            f"{fmt_ms(min(p99c))}–{fmt_ms(max(p99c))} ms", ok))
        high = same_rate("tokens")
        if high:
            speed = [goodput(t) / goodput(c) for c, t in high if goodput(c) > 0]
            p99t = [lat(t, "p99_ms") for _, t in high]
            if speed:
                targets.append((f"19. {part}: open loop at {s['open_share']:.0%} of token "
                                "batching's capacity, inputs/s of token / count batching ≥ 1.5×",
                                f"{min(speed):.2f}–{max(speed):.2f}× (token batching's p99 "
                                + ", ".join(f"{fmt_ms(p)}" for p in p99t if p is not None)
                                + " ms)", min(speed) >= 1.5))
    return out


RENDERERS["token_batching"] = render_token_batching
# The bulk-job scenarios' tables (loadtest/bench/bulk.py).
from .bulk import RENDERERS as BULK_RENDERERS, SHOWS as BULK_SHOWS  # noqa: E402

RENDERERS.update(BULK_RENDERERS)
SHOWS.update(BULK_SHOWS)
# The cache scenario's table (loadtest/bench/cache.py).
from .cache import RENDERERS as CACHE_RENDERERS, SHOWS as CACHE_SHOWS  # noqa: E402

RENDERERS.update(CACHE_RENDERERS)
SHOWS.update(CACHE_SHOWS)
# The steady-state scenario's tables (loadtest/bench/steady.py).
from .steady import RENDERERS as STEADY_RENDERERS, SHOWS as STEADY_SHOWS  # noqa: E402

RENDERERS.update(STEADY_RENDERERS)
SHOWS.update(STEADY_SHOWS)
# The two-models scenario's table (loadtest/bench/twomodels.py).
from .twomodels import RENDERERS as TWO_MODELS_RENDERERS, SHOWS as TWO_MODELS_SHOWS  # noqa: E402

RENDERERS.update(TWO_MODELS_RENDERERS)
SHOWS.update(TWO_MODELS_SHOWS)
# The tenants scenario's table (loadtest/bench/tenants.py).
from .tenants import RENDERERS as TENANTS_RENDERERS, SHOWS as TENANTS_SHOWS  # noqa: E402

RENDERERS.update(TENANTS_RENDERERS)
SHOWS.update(TENANTS_SHOWS)
# The retrieval scenario's table (loadtest/bench/retrieval.py).
from .retrieval import RENDERERS as RETRIEVAL_RENDERERS, SHOWS as RETRIEVAL_SHOWS  # noqa: E402

RENDERERS.update(RETRIEVAL_RENDERERS)
SHOWS.update(RETRIEVAL_SHOWS)
