"""The scenarios: each starts its own stack and returns its result (saved as <name>.json).

The numbers here are the benchmark's own choices (the fake GPU's cost model, rates, timeouts,
durations). What the binaries themselves default to (subject, MAX_BATCH_SIZE, MAX_WAIT_TIME,
MAX_CONCURRENT_BATCHES, QUEUE_CAP, ...) comes from their --help (defaults.py), via the Stack."""

from __future__ import annotations

import time

from .defaults import BinaryDefaults
from .procs import REPO, BenchError, log
from .report import goodput
from .stack import Stack, Target

# The GPU-like upstream of the issue: 5 ms + 20 us per input, one call at a time.
GPU_BASE_MS, GPU_PER_INPUT_US = 5, 20
DIRECT_CAPACITY = 1.0 / (GPU_BASE_MS / 1e3 + GPU_PER_INPUT_US / 1e6)  # ~199 req/s
# Scaling: a slow upstream (~300 req/s per worker at batch 32) so the machine is not the limit.
SLOW_BASE_MS, SLOW_PER_INPUT_US = 100, 200
# Client timeout (`embatch-loadtest run --timeout`) and gateway REQUEST_TIMEOUT, seconds; the
# CPU-model and scaling scenarios allow longer.
TIMEOUT_S = 2
LONG_TIMEOUT_S = 10

# The worker's batching defaults, as its --help declares them, passed explicitly so every result
# records them; plus the bench's own settings.
RECORDED_WORKER_DEFAULTS = ("MAX_BATCH_SIZE", "MAX_WAIT_TIME", "MAX_CONCURRENT_BATCHES",
                            "QUEUE_CAP", "DISPATCH_WHEN_IDLE")
WORKER_OVERRIDES = {"SHUTDOWN_GRACE": "2s"}  # stop quickly between runs

SCENARIOS = [
    ("gpu_rates", "1. GPU-like upstream: open loop at rising rates"),
    ("low_load", "2. Low load: the latency embatch adds"),
    ("cpu_model", "3. Built-in CPU model through the gateway"),
    ("pipeline", "4. Instant upstream: the pipeline's own ceiling and CPU cost"),
    ("scaling", "5. Scaling out: 1, 2 and 4 workers"),
    ("tuning", "6. MAX_WAIT_TIME x MAX_BATCH_SIZE at a fixed load"),
    ("overload", "7. Overload at 2x capacity: the throughput paradox"),
    ("tei_client_defaults", "8. Default settings, 2x overload, a TEI client with its own 2 s "
                            "timeout and no deadline"),
    ("slow_then_fast", "9. Upstream slow (4 s per call) for 10 s, then fast: recovery"),
    ("uneven_workers", "10. Two workers, one 5x slower: does the load follow capacity?"),
    ("sick_upstream", "11. One of two workers' upstream dies during the load"),
    ("worker_kill", "12. One of two workers is killed (SIGKILL) during the load"),
    ("closed_gpu", "13. GPU-like upstream, closed loop with 64 in flight: do the paths fill "
                   "batches alike?"),
]
SCENARIO_NAMES = [name for name, _ in SCENARIOS]


def worker_base(defaults: BinaryDefaults) -> dict[str, str]:
    """The environment every worker starts with (before a scenario's own settings)."""
    env = {k: defaults.worker_default(k) for k in RECORDED_WORKER_DEFAULTS}
    env.update(WORKER_OVERRIDES)
    return env


def call_ms(inputs: float) -> float:
    """The GPU-like fake's own time for one call of `inputs` inputs, in ms."""
    return GPU_BASE_MS + inputs * GPU_PER_INPUT_US / 1e3


def ceiling(batch: int) -> float:
    """Requests per second of the GPU-like upstream with full batches (~5,674 at 32)."""
    return batch / (GPU_BASE_MS / 1e3 + batch * GPU_PER_INPUT_US / 1e6)


def secs(s: float) -> str:
    return f"{s:g}s"


GPU_UPSTREAM = f"fake-upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} us/input, concurrency 1"


def run_entry(label: str, params: dict, report: dict) -> dict:
    return {"label": label, **params, "report": report}


def direct_full_batches(b: Stack, up: str, label: str) -> dict:
    """The load report of upstream `up` called directly with full batches (MAX_BATCH_SIZE
    inputs per request), two in flight (one waiting at the simulated GPU while the other runs):
    the best any batcher could do on this machine, the upstream's own per-call overhead
    included, where the full-batch ceiling counts its sleep alone."""
    batch = b.defaults.max_batch_size
    return b.load(f"direct k={batch} {label}", Target("direct", ["--url", up + "/embed"]),
                  concurrency=2, inputs_per_request=batch, warmup=2, duration=b.d(15, 5),
                  timeout=35)


def direct_inputs_per_s(report: dict, inputs: int) -> float:
    """Inputs/s answered by a [`direct_full_batches`] run of `inputs` per request."""
    return goodput(report) * inputs


def gpu_stack(b: Stack):
    """nats-server, the GPU-like fake upstream, one worker on it (ready) and a gateway with the
    bench's 2 s REQUEST_TIMEOUT: the stack of scenarios 1, 2 and 13."""
    nats = b.nats()
    _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
    w = b.worker(nats, tei_url=up)
    b.wait_workers(nats, [w])
    _, gw = b.gateway(nats, secs(TIMEOUT_S))
    return nats, up, w, gw


def gpu_workers(b: Stack, nats, names=("A", "B"), **env) -> tuple[list, list]:
    """One worker per name in `names` (with `env`), each on its own GPU-like fake upstream
    (`fake-upstream-<name>`, `worker-<name>`), waited for; the upstreams' processes and the
    workers."""
    upstreams, workers = [], []
    for name in names:
        up_child, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1,
                                       name=f"fake-upstream-{name}")
        upstreams.append(up_child)
        workers.append(b.worker(nats, tei_url=up, name=f"worker-{name}", **env))
    b.wait_workers(nats, workers)
    return upstreams, workers


def scenario_gpu_rates(b: Stack) -> dict:
    rates = [100, 400, 2000, 5400] if b.quick else [100, 200, 400, 1000, 2500, 4000, 5000,
                                                     5400, 5550]
    direct_max_rate = 400  # beyond this the direct path only times out
    warmup, duration = b.d(2, 1), b.d(8, 3)
    nats, up, w, gw = gpu_stack(b)
    direct = Target("direct", ["--url", up + "/embed"])
    runs = []
    for rate in rates:
        for target in (direct, gw, nats.target()):
            if target.path == "direct" and rate > direct_max_rate:
                continue
            r = b.load(f"{target.path} @ {rate} req/s", target, rate=rate, warmup=warmup,
                       duration=duration, timeout=TIMEOUT_S,
                       workers=[w] if target.path != "direct" else ())
            runs.append(run_entry(target.path, {"path": target.path, "rate": rate}, r))
    return {"settings": {"upstream": GPU_UPSTREAM, "worker": w.settings,
                         "gateway": {"REQUEST_TIMEOUT": secs(TIMEOUT_S)}, "timeout_s": TIMEOUT_S,
                         "warmup_s": warmup, "duration_s": duration,
                         "direct_capacity": DIRECT_CAPACITY,
                         "ceiling": ceiling(b.defaults.max_batch_size)},
            "runs": runs}


def scenario_low_load(b: Stack) -> dict:
    # ~20 req/s, but not exactly: at 20 req/s every request would be due at the same phase of
    # the 1 ms timer ticks of the load generator and of the worker (tokio's timer resolution),
    # and that phase, different in every run, would shift every latency of a run by the same
    # 0-1 ms. At 19.93 req/s the phase sweeps, so each run sees the average.
    rate, warmup, duration = 19.93, 1, b.d(15, 5)
    nats, up, w, gw = gpu_stack(b)
    runs = []
    for target in (Target("direct", ["--url", up + "/embed"]), gw, nats.target()):
        r = b.load(f"{target.path} @ {rate} req/s", target, rate=rate, warmup=warmup,
                   duration=duration, timeout=TIMEOUT_S,
                   workers=[w] if target.path != "direct" else ())
        runs.append(run_entry(target.path, {"path": target.path, "rate": rate}, r))
    # The same NATS path with a bare relay in the worker's place (one HTTP call per message):
    # what the NATS hops cost on their own, apart from the worker.
    b.stop_worker(nats, w, 0)
    b.relay(nats, up)
    relay = Target("relay", nats.target().args)
    r = b.load(f"nats relay @ {rate} req/s", relay, rate=rate, warmup=warmup,
               duration=duration, timeout=TIMEOUT_S)
    runs.append(run_entry("relay", {"path": "relay", "rate": rate}, r))
    return {"settings": {"upstream": GPU_UPSTREAM, "worker": w.settings, "rate": rate,
                         "warmup_s": warmup, "duration_s": duration,
                         "max_wait_ms": b.defaults.max_wait_ms},
            "runs": runs}


def cpu_model_stack(b: Stack, request_timeout: str):
    nats = b.nats()
    w = b.worker(nats, model=True)
    b.wait_workers(nats, [w], timeout=180)
    _, gw = b.gateway(nats, request_timeout)
    return nats, w, gw


def scenario_cpu_model(b: Stack) -> dict:
    warmup, duration = b.d(3, 2), b.d(10, 3)
    _, w, gw = cpu_model_stack(b, secs(LONG_TIMEOUT_S))
    runs = []
    for c in (1, 16, 64):
        r = b.load(f"gateway c={c}", gw, concurrency=c, warmup=warmup, duration=duration,
                   timeout=LONG_TIMEOUT_S, workers=[w])
        runs.append(run_entry("gateway", {"path": "gateway", "concurrency": c}, r))
    return {"settings": {"upstream": "built-in CPU model (MODEL_DIR)", "worker": w.settings,
                         "gateway": {"REQUEST_TIMEOUT": secs(LONG_TIMEOUT_S)},
                         "timeout_s": LONG_TIMEOUT_S,
                         "corpus": "generated sentences of 12 words",
                         "warmup_s": warmup, "duration_s": duration},
            "runs": runs}


def scenario_pipeline(b: Stack) -> dict:
    duration, concurrency = b.d(10, 3), 256
    nats = b.nats()
    up_child, up = b.fake_upstream(0, 0, 64)
    w = b.worker(nats, tei_url=up)
    b.wait_workers(nats, [w])
    gw_child, gw = b.gateway(nats, secs(TIMEOUT_S))
    procs = {"gateway": gw_child, "worker": w.child, "nats-server": nats.child,
             "fake-upstream": up_child}
    runs = []
    # Direct first: the upstream's own ceiling on this machine, the reference of issue 11's
    # targets (gateway >= 80 %, NATS >= 90 % of it, in the same run).
    for target in (Target("direct", ["--url", up + "/embed"]), gw, nats.target()):
        # No warm-up, so CPU time and request counts cover exactly the same requests.
        r = b.load(f"{target.path} c={concurrency}", target, concurrency=concurrency, warmup=0,
                   duration=duration, timeout=TIMEOUT_S, measure_cpu_of=procs,
                   workers=[w] if target.path != "direct" else ())
        runs.append(run_entry(target.path, {"path": target.path, "concurrency": concurrency}, r))
    return {"settings": {"upstream": "fake-upstream 0 ms + 0 us/input, concurrency 64 (instant)",
                         "worker": w.settings, "duration_s": duration,
                         "concurrency": concurrency},
            "runs": runs}


def scenario_closed_gpu(b: Stack) -> dict:
    """Issue 11: closed loop at 64 in flight on the GPU-like upstream: whether the gateway hop
    leaves batches shorter than NATS direct (mean batch and req/s side by side, and the
    upstream alone for scale)."""
    duration, warmup, concurrency = b.d(10, 3), b.d(2, 1), 64
    nats, up, w, gw = gpu_stack(b)
    runs = []
    for target in (Target("direct", ["--url", up + "/embed"]), gw, nats.target()):
        r = b.load(f"{target.path} c={concurrency}", target, concurrency=concurrency,
                   warmup=warmup, duration=duration, timeout=TIMEOUT_S,
                   workers=[w] if target.path != "direct" else ())
        runs.append(run_entry(target.path, {"path": target.path, "concurrency": concurrency}, r))
    return {"settings": {"upstream": GPU_UPSTREAM, "worker": w.settings,
                         "gateway": {"REQUEST_TIMEOUT": secs(TIMEOUT_S)},
                         "timeout_s": TIMEOUT_S, "warmup_s": warmup, "duration_s": duration,
                         "concurrency": concurrency,
                         "ceiling": ceiling(b.defaults.max_batch_size)},
            "runs": runs}


def scenario_scaling(b: Stack) -> dict:
    warmup, duration = b.d(3, 2), b.d(10, 4)
    per_worker = 160  # in flight per worker: 2 batches of 32 upstream + full batches waiting
    runs = []
    settings = {}
    for n in (1, 2, 4):
        mark = b.sup.mark()
        try:
            nats = b.nats()
            workers = []
            for i in range(n):
                _, up = b.fake_upstream(SLOW_BASE_MS, SLOW_PER_INPUT_US, 1,
                                        name=f"fake-upstream-{i}")
                workers.append(b.worker(nats, tei_url=up, name=f"worker-{i}"))
            b.wait_workers(nats, workers)
            _, gw = b.gateway(nats, secs(LONG_TIMEOUT_S))
            r = b.load(f"gateway, {n} worker(s), c={per_worker * n}", gw,
                       concurrency=per_worker * n, warmup=warmup, duration=duration,
                       timeout=LONG_TIMEOUT_S, workers=workers)
            runs.append(run_entry("gateway", {"path": "gateway", "workers": n,
                                              "concurrency": per_worker * n}, r))
            settings = workers[0].settings
        finally:
            b.sup.stop_since(mark)
    batch = b.defaults.max_batch_size
    per_worker_capacity = batch / (SLOW_BASE_MS / 1e3 + batch * SLOW_PER_INPUT_US / 1e6)
    return {"settings": {"upstream": f"one fake-upstream per worker, {SLOW_BASE_MS} ms + "
                                     f"{SLOW_PER_INPUT_US} us/input, concurrency 1",
                         "worker": settings, "gateway": {"REQUEST_TIMEOUT": secs(LONG_TIMEOUT_S)},
                         "timeout_s": LONG_TIMEOUT_S, "warmup_s": warmup,
                         "duration_s": duration, "per_worker_capacity": per_worker_capacity},
            "runs": runs}


def scenario_tuning(b: Stack) -> dict:
    rate = 1500
    waits = [1, 5] if b.quick else [1, 2, 5, 10]
    batches = [8, 32] if b.quick else [8, 32, 64]
    warmup, duration = b.d(1, 1), b.d(6, 3)
    nats = b.nats()
    _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
    _, gw = b.gateway(nats, secs(TIMEOUT_S))
    runs = []
    for wait in waits:
        for batch in batches:
            w = b.worker(nats, tei_url=up, MAX_WAIT_TIME=f"{wait}ms", MAX_BATCH_SIZE=str(batch))
            try:
                b.wait_workers(nats, [w])
                r = b.load(f"wait {wait} ms, batch {batch}", gw, rate=rate, warmup=warmup,
                           duration=duration, timeout=TIMEOUT_S, workers=[w])
            finally:
                b.stop_worker(nats, w, 0)
            runs.append(run_entry("gateway", {"path": "gateway", "rate": rate,
                                              "max_wait_ms": wait, "max_batch_size": batch}, r))
    return {"settings": {"upstream": GPU_UPSTREAM, "rate": rate,
                         "worker": {k: v for k, v in b.worker_base.items()
                                    if k not in ("MAX_WAIT_TIME", "MAX_BATCH_SIZE")},
                         "warmup_s": warmup, "duration_s": duration},
            "runs": runs}


def overload_runs(b: Stack, *, request_timeout: str | None, defaults_only: bool) -> dict:
    """Open loop at twice the capacity measured just before (closed loop, same stack): the
    GPU-like upstream direct and through the gateway, then the built-in CPU model through the
    gateway. `request_timeout` None leaves the gateway's REQUEST_TIMEOUT at its default;
    `defaults_only` starts the workers with nothing but what they must be told."""
    cap_warmup, cap_duration = b.d(2, 1), b.d(5, 3)
    warmup, duration = b.d(2, 1), b.d(12, 4)
    runs = []
    mark = b.sup.mark()
    try:
        nats = b.nats()
        _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
        w = b.worker(nats, tei_url=up, defaults_only=defaults_only)
        b.wait_workers(nats, [w])
        _, gw = b.gateway(nats, request_timeout)
        gpu_worker = w.settings
        for target, c in ((Target("direct", ["--url", up + "/embed"]), 8), (gw, 512)):
            cap = b.load(f"{target.path} capacity c={c}", target, concurrency=c,
                         warmup=cap_warmup, duration=cap_duration, timeout=TIMEOUT_S)
            capacity = goodput(cap)
            over = b.load(f"{target.path} @ 2x capacity", target, rate=2 * capacity,
                          warmup=warmup, duration=duration, timeout=TIMEOUT_S,
                          workers=[w] if target.path != "direct" else ())
            runs.append(run_entry(target.path, {"upstream": "gpu", "path": target.path,
                                                "capacity": capacity, "capacity_run": cap,
                                                "rate": 2 * capacity}, over))
    finally:
        b.sup.stop_since(mark)
    # Fresh generated sentences, as everywhere: a fixed corpus of 30 texts would measure the
    # worker's cache and dedup, not the model.
    mark = b.sup.mark()
    try:
        nats = b.nats()
        w = b.worker(nats, model=True, defaults_only=defaults_only)
        b.wait_workers(nats, [w], timeout=180)
        _, gw = b.gateway(nats, request_timeout)
        cap = b.load("cpu model capacity c=128", gw, concurrency=128, warmup=b.d(3, 2),
                     duration=cap_duration, timeout=TIMEOUT_S)
        capacity = goodput(cap)
        if capacity > 0:
            over = b.load("cpu model @ 2x capacity", gw, rate=2 * capacity, warmup=warmup,
                          duration=duration, timeout=TIMEOUT_S, workers=[w])
            runs.append(run_entry("gateway", {"upstream": "cpu", "path": "gateway",
                                              "capacity": capacity, "capacity_run": cap,
                                              "rate": 2 * capacity}, over))
        else:
            # Nothing succeeded in the capacity run: there is no 2x to offer. Recorded as it is
            # (the row shows the capacity run; its targets are missed).
            log("  no success in the capacity run: the 2x run is skipped")
            runs.append(run_entry("gateway", {"upstream": "cpu", "path": "gateway",
                                              "capacity": 0.0, "capacity_run": cap,
                                              "rate": None, "skipped": True}, cap))
        cpu_worker = w.settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"gpu_upstream": GPU_UPSTREAM, "cpu_upstream": "built-in CPU model",
                         "gpu_worker": gpu_worker, "cpu_worker": cpu_worker,
                         "timeout_s": TIMEOUT_S, "capacity_runs": "closed loop: direct c=8, "
                         "embatch c=512 (GPU-like), c=128 (CPU model)",
                         "warmup_s": warmup, "duration_s": duration,
                         "corpus": "generated"},
            "runs": runs}


def scenario_overload(b: Stack) -> dict:
    res = overload_runs(b, request_timeout=secs(TIMEOUT_S), defaults_only=False)
    res["settings"]["gateway"] = {"REQUEST_TIMEOUT": secs(TIMEOUT_S)}
    return res


# What the binaries default to, recorded by the scenarios that run them on their defaults (for
# the record only: the processes are started without these variables).
DEFAULTS_RECORDED = {
    "worker": ("MAX_BATCH_SIZE", "MAX_WAIT_TIME", "MAX_CONCURRENT_BATCHES", "QUEUE_CAP",
               "MAX_QUEUE_BYTES", "MAX_QUEUE_DELAY", "DEFAULT_DEADLINE", "UPSTREAM_TIMEOUT"),
    "gateway": ("REQUEST_TIMEOUT", "MAX_IN_FLIGHT", "MAX_CONNECTIONS"),
}


def recorded_defaults(b: Stack) -> dict:
    return {"worker": {k: b.defaults.worker.get(k) for k in DEFAULTS_RECORDED["worker"]},
            "gateway": {k: b.defaults.gateway.get(k) for k in DEFAULTS_RECORDED["gateway"]}}


def scenario_tei_client_defaults(b: Stack) -> dict:
    """Issue 8: a client like a TEI/OpenAI client (its own 2 s timeout, no deadline header) at
    twice the capacity, gateway and worker on their defaults (no REQUEST_TIMEOUT, no worker
    settings but the upstream and addresses). Capacity is measured closed loop just before, on the
    same stack; the direct row is the same 2x overload against the fake upstream alone."""
    res = overload_runs(b, request_timeout=None, defaults_only=True)
    res["settings"].update({"gateway": "defaults (no REQUEST_TIMEOUT)",
                            "binary_defaults": recorded_defaults(b),
                            "client": f"embatch-loadtest run --timeout {secs(TIMEOUT_S)}, "
                                      "no x-embatch-timeout-ms header"})
    return res


# slow_then_fast: the upstream's extra delay per call and how long it lasts from its start.
SLOW_DELAY_S, SLOW_FOR_S = 4, 10
# A second is "recovered" when its goodput is at least this share of the offered rate.
RECOVERED_SHARE = 0.95


def recovery(per_second: dict, switch_ms: int, rate: float, window_s: int) -> dict:
    """When goodput got back to the offered rate after the upstream's switch to fast.

    Uses the loadtest's per-second series (seconds of completion time from `start_unix_ms`),
    within the measured window only. A second counts as recovered when its goodput is ≥
    RECOVERED_SHARE of the offered rate. `recovery_s`, at one-second resolution: the end,
    relative to the switch, of the last second after the switch that was not recovered (so every
    whole second from then on to the end of the window was), or the start of the first second
    after the switch (≈ 0) when none was below. `None` when the window's last second was still
    below."""
    start, good = per_second["start_unix_ms"], per_second["goodput"]
    offsets = [(start + 1000 * i - switch_ms) / 1000 for i in range(min(len(good), window_s))]
    # Seconds that start at the switch or later (50 ms of slack for the alignment of the load
    # generator's seconds to the switch, which the scenario aims at exactly).
    after = [i for i, o in enumerate(offsets) if o >= -0.05]
    below = [i for i in after if good[i] < RECOVERED_SHARE * rate]
    if not after:
        rec = None
    elif not below:
        rec = max(0.0, offsets[after[0]])
    elif below[-1] == len(offsets) - 1:
        rec = None
    else:
        rec = offsets[below[-1]] + 1
    return {"recovery_s": rec, "second_offsets_s": offsets, "seconds_after_switch": after,
            "seconds_below": below, "recovered_share": RECOVERED_SHARE}


def scenario_slow_then_fast(b: Stack) -> dict:
    """Issue 8: the GPU-like upstream is slow for its first SLOW_FOR_S (every call SLOW_DELAY_S
    extra), then fast; open loop at ~50% of the fast ceiling through the gateway, everything on
    its defaults, the client's own 2 s timeout. The load starts so that a second of the load
    generator's per-second series begins at the switch."""
    slow_for, pre, duration = (SLOW_FOR_S, 8, 20) if not b.quick else (6, 3, 10)
    rate = round(0.5 * ceiling(b.defaults.max_batch_size))
    nats = b.nats()
    up_child, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1,
                                   slow_for=secs(slow_for), slow_delay=secs(SLOW_DELAY_S))
    slow_until = b.log_value(up_child, "slow until unix_ms=")
    if slow_until is None:
        raise BenchError("the fake upstream did not print `slow until unix_ms=`")
    w = b.worker(nats, tei_url=up, defaults_only=True)
    b.wait_workers(nats, [w])
    _, gw = b.gateway(nats, None)
    # The loadtest's second 0 starts at its first send, a few ms after it is spawned.
    wait = (int(slow_until) - 1000 * pre) / 1000 - time.time() - 0.005
    if wait > 0:
        time.sleep(wait)
    else:
        log(f"  the stack took too long to start: the load begins {-wait:.1f} s late")
    r = b.load(f"gateway @ {rate} req/s, slow {slow_for} s then fast", gw, rate=rate, warmup=0,
               duration=duration, timeout=TIMEOUT_S, workers=[w])
    fast_since = b.log_value(up_child, "fast since unix_ms=")
    switch_ms = int(fast_since or slow_until)
    rec = recovery(r["per_second"], switch_ms, rate, duration) if r.get("per_second") else {}
    log(f"  recovery after the switch: {rec.get('recovery_s')} s; goodput per second "
        f"{(r.get('per_second') or {}).get('goodput')}")
    return {"settings": {"upstream": f"{GPU_UPSTREAM}; every call +{SLOW_DELAY_S} s during its "
                                     f"first {slow_for} s",
                         "worker": w.settings, "gateway": "defaults (no REQUEST_TIMEOUT)",
                         "binary_defaults": recorded_defaults(b),
                         "client": f"embatch-loadtest run --timeout {secs(TIMEOUT_S)}, "
                                   "no x-embatch-timeout-ms header",
                         "timeout_s": TIMEOUT_S, "rate": rate,
                         "fast_ceiling": ceiling(b.defaults.max_batch_size),
                         "slow_for_s": slow_for, "slow_delay_s": SLOW_DELAY_S,
                         "duration_s": duration, "switch_at_second": pre},
            "switch_unix_ms": switch_ms, "switch_logged": fast_since is not None,
            "recovery": rec,
            "runs": [run_entry("gateway", {"path": "gateway", "rate": rate}, r)]}


# Issue 9: every scenario below runs its stack twice, "before" with every worker a permanent
# member of the queue group (MEMBERSHIP=static, the old behaviour) and "after" with
# MEMBERSHIP=adaptive (a worker leaves the group while its upstream is unhealthy or its backlog
# is long, and rejoins).
MEMBERSHIPS = (("before", "static"), ("after", "adaptive"))
# uneven_workers: worker A's upstream (ms, us/input; ~1,380 req/s at batch 32) and worker B's,
# 5x slower (~276 req/s).
UNEVEN_FAST = (20, 100)
UNEVEN_SLOW = (100, 500)


def capacity(base_ms: float, per_input_us: float, batch: int) -> float:
    """Requests per second of an upstream that computes one call at a time, at full batches."""
    return batch / (base_ms / 1e3 + batch * per_input_us / 1e6)


def membership_runs(b: Stack, run_one) -> list[dict]:
    """`run_one(when, membership)` once per MEMBERSHIPS entry, each on a stack of its own (all
    its processes stopped after it)."""
    runs = []
    for when, membership in MEMBERSHIPS:
        mark = b.sup.mark()
        try:
            runs.append(run_one(when, membership))
        finally:
            b.sup.stop_since(mark)
    return runs


def without_membership(settings: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in settings.items() if k != "MEMBERSHIP"}


def event_offsets(r: dict) -> list[dict]:
    """The report's `events`, each with `offset_s`: when it ran, in seconds from the start of the
    loadtest's measured window (`per_second.start_unix_ms`)."""
    start = (r.get("per_second") or {}).get("start_unix_ms")
    return [{**e, "offset_s": (e["unix_ms"] - start) / 1e3 if start else None}
            for e in r.get("events") or []]


def scenario_uneven_workers(b: Stack) -> dict:
    """Issue 9: two workers on upstreams of very different speed (A ~1,380 req/s, B 5x slower,
    ~276 req/s at batch 32), open loop at 1,000 req/s through the gateway: well within A + B's
    capacity, but not if the queue group splits the requests evenly."""
    rate, warmup, duration = 1000, b.d(2, 1), b.d(15, 5)
    worker_settings = {}

    def run(when: str, membership: str) -> dict:
        nats = b.nats()
        workers = []
        for name, (base_ms, per_input_us) in (("A", UNEVEN_FAST), ("B", UNEVEN_SLOW)):
            _, up = b.fake_upstream(base_ms, per_input_us, 1, name=f"fake-upstream-{name}")
            workers.append(b.worker(nats, tei_url=up, name=f"worker-{name}",
                                    MEMBERSHIP=membership))
        b.wait_workers(nats, workers)
        _, gw = b.gateway(nats, secs(TIMEOUT_S))
        r = b.load(f"{when}: MEMBERSHIP={membership} @ {rate} req/s", gw, rate=rate,
                   warmup=warmup, duration=duration, timeout=TIMEOUT_S, workers=workers)
        worker_settings.update(without_membership(workers[0].settings))
        return run_entry("gateway", {"path": "gateway", "when": when, "membership": membership,
                                     "rate": rate, "workers": ["A", "B"]}, r)

    runs = membership_runs(b, run)
    batch = b.defaults.max_batch_size
    return {"settings": {"upstreams": {
                             "A": f"fake-upstream {UNEVEN_FAST[0]} ms + {UNEVEN_FAST[1]} us/input,"
                                  " concurrency 1",
                             "B": f"fake-upstream {UNEVEN_SLOW[0]} ms + {UNEVEN_SLOW[1]} us/input,"
                                  " concurrency 1"},
                         "capacity": {"A": capacity(*UNEVEN_FAST, batch),
                                      "B": capacity(*UNEVEN_SLOW, batch)},
                         "worker": worker_settings,
                         "gateway": {"REQUEST_TIMEOUT": secs(TIMEOUT_S)},
                         "timeout_s": TIMEOUT_S, "rate": rate, "warmup_s": warmup,
                         "duration_s": duration},
            "runs": runs}


def kill_during_load(b: Stack, *, victim: str, warmup: float, duration: float,
                     kill_at: float, rate: float) -> dict:
    """Two equal workers (A and B), each on its own GPU-like upstream, open loop at `rate`
    through the gateway; `kill_at` s into the measured window, SIGKILL of worker B's upstream
    (`victim` "upstream") or of worker B itself (`victim` "worker"), left down."""
    worker_settings = {}

    def run(when: str, membership: str) -> dict:
        nats = b.nats()
        upstreams, workers = gpu_workers(b, nats, MEMBERSHIP=membership)
        _, gw = b.gateway(nats, secs(TIMEOUT_S))
        doomed = upstreams[1] if victim == "upstream" else workers[1].child
        event = f"SIGKILL {doomed.name}"
        r = b.load(f"{when}: MEMBERSHIP={membership} @ {rate} req/s", gw, rate=rate,
                   warmup=warmup, duration=duration, timeout=TIMEOUT_S, workers=workers,
                   events=[(kill_at, event, lambda: b.sup.kill(doomed))])
        events = event_offsets(r)
        if any(e["error"] for e in events):
            raise BenchError(f"the kill failed: {events}")
        if doomed.alive():
            raise BenchError(f"{doomed.name} survived SIGKILL")
        killed = events[0]
        log(f"  {event} at +{killed['offset_s']:.2f} s of the measured window; goodput per "
            f"second {(r.get('per_second') or {}).get('goodput')}")
        worker_settings.update(without_membership(workers[0].settings))
        return run_entry("gateway", {"path": "gateway", "when": when, "membership": membership,
                                     "rate": rate, "killed": event,
                                     "kill_unix_ms": killed["unix_ms"],
                                     "kill_offset_s": killed["offset_s"]}, r)

    runs = membership_runs(b, run)
    return {"settings": {"upstream": f"one {GPU_UPSTREAM} per worker",
                         "worker": worker_settings,
                         "gateway": {"REQUEST_TIMEOUT": secs(TIMEOUT_S)},
                         "timeout_s": TIMEOUT_S, "rate": rate, "warmup_s": warmup,
                         "duration_s": duration, "kill_at_s": kill_at,
                         "victim": ("worker B's fake upstream (calls to it: connection refused)"
                                    if victim == "upstream" else "worker B (kill -9)")},
            "runs": runs}


def scenario_sick_upstream(b: Stack) -> dict:
    """Issue 9: worker B's upstream dies (SIGKILL, left down) 4 s into the load; B itself keeps
    running and answering."""
    return kill_during_load(b, victim="upstream", warmup=1, duration=b.d(12, 8),
                            kill_at=b.d(4, 3), rate=200)


def scenario_worker_kill(b: Stack) -> dict:
    """Issue 9: worker B is killed with SIGKILL 4 s into the load (no drain, no goodbye: its
    requests in flight are lost and only the gateway's deadline ends them)."""
    return kill_during_load(b, victim="worker", warmup=1, duration=b.d(12, 8),
                            kill_at=b.d(4, 3), rate=200)


SCENARIO_FUNCS = {
    "gpu_rates": scenario_gpu_rates,
    "low_load": scenario_low_load,
    "cpu_model": scenario_cpu_model,
    "pipeline": scenario_pipeline,
    "scaling": scenario_scaling,
    "tuning": scenario_tuning,
    "overload": scenario_overload,
    "tei_client_defaults": scenario_tei_client_defaults,
    "slow_then_fast": scenario_slow_then_fast,
    "uneven_workers": scenario_uneven_workers,
    "sick_upstream": scenario_sick_upstream,
    "worker_kill": scenario_worker_kill,
    "closed_gpu": scenario_closed_gpu,
}


# Recovery within the deadline: two workers, each on its own GPU-like upstream, the gateway with
# its default REQUEST_TIMEOUT, open loop; every failure counts (client timeouts included). The
# loadtest's own timeout sits above the gateway's default (30 s) so the gateway decides.
RECOVERY_TIMEOUT_S = 35
RECOVERY_RATE = 1000  # req/s: what the 1 s restart of the issue was measured at
SCENARIOS += [
    ("recovery_worker_kill", "14. Recovery: one of two workers kill -9ed, default timeout"),
    ("recovery_churn", "15. Recovery: membership churn (one upstream stopped and continued "
                       "every 3 s for 60 s)"),
    ("recovery_nats_restart", "16. Recovery: nats-server restarted (1 s and 5 s down)"),
    ("recovery_upstream_stop", "17. Recovery: one of two workers' upstream stopped "
                               "(SIGTERM and SIGKILL)"),
]
SCENARIO_NAMES += [name for name, _ in SCENARIOS[len(SCENARIO_NAMES):]]


def restart_nats(b: Stack, nats, down_s: float) -> None:
    """Kills nats-server (SIGKILL), waits `down_s`, and starts it again with the same command
    line: the same ports and the same JetStream store."""
    from .procs import port_open, wait_until
    b.sup.kill(nats.child)
    time.sleep(down_s)
    nats.child = b.sup.spawn("nats-server", nats.argv, b.env())
    wait_until("nats-server to come back", lambda: port_open(nats.port), 15, [nats.child])


COUNTERS = ("embatch_worker_requests_shed_total", "embatch_worker_requests_total",
            "embatch_gateway_connections_refused_total", "embatch_client_retries_total",
            "embatch_worker_membership_changes_total")


def counters(url: str) -> dict[str, float] | None:
    """The non-zero samples of COUNTERS on the Prometheus page at `url`, by series
    (`name{labels}`); None when it does not answer (a killed process)."""
    from .procs import http_get
    try:
        status, body = http_get(url)
    except OSError:
        return None
    if status != 200:
        return None
    out = {}
    for line in body.decode(errors="replace").splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(COUNTERS):
            try:
                if float(value):
                    out[series] = float(value)
            except ValueError:
                pass
    return out


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of process `pid` so far (VmHWM), in MiB; None when gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def recovery_runs(b: Stack, cases: list[tuple[str, float, float, object]]) -> dict:
    """For each `(label, warmup_s, duration_s, events_of)`: a stack of its own (nats-server, two
    GPU-like upstreams, workers A and B with the defaults, the gateway with its defaults), open
    loop at RECOVERY_RATE; `events_of(nats, upstreams, workers)` gives the load's events."""
    runs, worker_settings = [], {}
    for label, warmup, duration, events_of in cases:
        mark = b.sup.mark()
        try:
            nats = b.nats()
            upstreams, workers = gpu_workers(b, nats)
            gw_child, gw = b.gateway(nats, None)
            gw_metrics = gw.args[1].removesuffix("/embed") + "/metrics"
            events = events_of(nats, upstreams, workers)
            r = b.load(f"{label} @ {RECOVERY_RATE} req/s", gw, rate=RECOVERY_RATE,
                       warmup=warmup, duration=duration, timeout=RECOVERY_TIMEOUT_S,
                       workers=workers, events=events)
            fired = event_offsets(r)
            if any(e["error"] for e in fired):
                raise BenchError(f"{label}: an event failed: {fired}")
            worker_settings.update(workers[0].settings)
            # Why requests failed or were resent, from the processes' own counters (whole run,
            # warm-up included): sheds by reason per worker, the gateway's refused connections
            # and its client's resends by reason.
            r["counters"] = {
                "gateway": counters(gw_metrics),
                "gateway_peak_rss_mb": peak_rss_mb(gw_child.popen.pid),
                "workers": [counters(f"http://127.0.0.1:{w.metrics_port}/metrics")
                            for w in workers]}
            log(f"  counters: {r['counters']}")
            runs.append(run_entry("gateway", {"path": "gateway", "case": label,
                                              "rate": RECOVERY_RATE, "events": fired}, r))
        finally:
            b.sup.stop_since(mark)
    return {"settings": {"upstream": f"one {GPU_UPSTREAM} per worker",
                         "worker": worker_settings, "gateway": "defaults",
                         "timeout_s": RECOVERY_TIMEOUT_S, "rate": RECOVERY_RATE},
            "runs": runs}


def scenario_recovery_worker_kill(b: Stack) -> dict:
    """Worker B is killed with SIGKILL 4 s into the load: what it held is resent when its
    heartbeat stops."""
    at = b.d(4, 3)
    return recovery_runs(b, [("worker B kill -9", 1, b.d(12, 8), lambda nats, ups, ws: [
        (at, "SIGKILL worker-B", lambda: b.sup.kill(ws[1].child))])])


def scenario_recovery_churn(b: Stack) -> dict:
    """Worker B's upstream is stopped (SIGSTOP) for 1.5 s and continued (SIGCONT) every 3 s:
    B fills, leaves the queue group, drains and rejoins, again and again."""
    import signal
    duration = b.d(60, 15)

    def events(nats, ups, ws):
        out, t = [], 2.0
        while t + 1.5 < duration - 1:
            out.append((t, f"SIGSTOP upstream-B +{t:g}s",
                        lambda: ups[1].popen.send_signal(signal.SIGSTOP)))
            out.append((t + 1.5, f"SIGCONT upstream-B +{t + 1.5:g}s",
                        lambda: ups[1].popen.send_signal(signal.SIGCONT)))
            t += 3
        return out

    return recovery_runs(b, [("churn", 1, duration, events)])


def scenario_recovery_nats_restart(b: Stack) -> dict:
    """nats-server killed 4 s into the load and started again on the same port after 1 s, and
    in a second run after 5 s."""
    at = b.d(4, 3)
    return recovery_runs(b, [
        (f"nats-server down {down:g} s", 1, b.d(14, 12),
         lambda nats, ups, ws, down=down: [
             (at, f"restart nats-server ({down:g} s down)",
              lambda: restart_nats(b, nats, down))])
        for down in (1.0, 5.0)])


def scenario_recovery_upstream_stop(b: Stack) -> dict:
    """Worker B's upstream stopped 4 s into the load, with SIGTERM, and in a second run with
    SIGKILL; left down."""
    import signal
    at = b.d(4, 3)
    return recovery_runs(b, [
        (f"upstream B {name}", 1, b.d(12, 8),
         lambda nats, ups, ws, sig=sig, name=name: [
             (at, f"{name} upstream-B", lambda: b.sup.kill(ups[1], sig))])
        for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL))])


INDEXING_INPUTS = 512  # inputs per request: the gateway's default MAX_CLIENT_BATCH_SIZE
INDEXING_IN_FLIGHT = 8
SCENARIOS += [("indexing", "18. An indexing client: 8 in flight x 512-input requests, "
                           "default settings")]
SCENARIO_NAMES += ["indexing"]


INDEXING_DIMS = (384, 1024)  # MiniLM's and a large model's vectors (bge-large, e5-large)


def scenario_indexing(b: Stack) -> dict:
    """A client posting its chunks: closed loop, INDEXING_IN_FLIGHT requests of INDEXING_INPUTS
    inputs each through the gateway, whose default REQUEST_TIMEOUT (30 s) is their deadline; one
    worker with every setting at its default on the GPU-like upstream; nats-server with the
    8 MB max_payload of nats/nats.conf (a 512-input reply of 384 floats is over the 1 MB default).
    Once per vector size of INDEXING_DIMS. Goodput in inputs/s against the upstream's full-batch
    ceiling."""
    runs, settings = [], {}
    for dim in INDEXING_DIMS:
        mark = b.sup.mark()
        try:
            nats = b.nats(max_payload="8MB")
            up_child, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1,
                                           extra=["--dim", str(dim)])
            w = b.worker(nats, tei_url=up, defaults_only=True)
            b.wait_workers(nats, [w])
            gw_child, gw = b.gateway(nats, None)
            # Where the two cores go: the upstream's simulated GPU sleeps, so every process's
            # CPU time competes with the others for the machine.
            procs = {"gateway": gw_child, "worker": w.child, "nats-server": nats.child,
                     "fake-upstream": up_child}
            batch = b.defaults.max_batch_size
            runs.append(run_entry("direct", {"path": "direct", "dim": dim, "inputs": batch},
                                  direct_full_batches(b, up, f"dim={dim}")))
            r = b.load(f"indexing c={INDEXING_IN_FLIGHT} k={INDEXING_INPUTS} dim={dim}", gw,
                       concurrency=INDEXING_IN_FLIGHT, inputs_per_request=INDEXING_INPUTS,
                       warmup=2, duration=b.d(60, 15), timeout=35, workers=[w],
                       measure_cpu_of=procs)
            settings = w.settings
        finally:
            b.sup.stop_since(mark)
        runs.append(run_entry("gateway", {"path": "gateway", "dim": dim}, r))
    return {"settings": {"upstream": GPU_UPSTREAM, "worker": settings, "gateway": "defaults",
                         "in_flight": INDEXING_IN_FLIGHT, "inputs": INDEXING_INPUTS,
                         "ceiling_inputs_per_s": ceiling(b.defaults.max_batch_size)},
            "runs": runs}


SCENARIO_FUNCS.update({
    "indexing": scenario_indexing,
    "recovery_worker_kill": scenario_recovery_worker_kill,
    "recovery_churn": scenario_recovery_churn,
    "recovery_nats_restart": scenario_recovery_nats_restart,
    "recovery_upstream_stop": scenario_recovery_upstream_stop,
})


# Token batching: a mixed-length corpus (mostly short queries, some paragraphs, a few over the
# built-in model's 256-token limit, see mixed_corpus.py), single-input requests over NATS
# direct, "truncate": true; the worker batching by input counts (BATCH_COST=inputs) against its
# defaults (token budget and shape, BATCH_COST=auto), alternating within one run.
TOKEN_MODES = (("count", {"BATCH_COST": "inputs"}), ("tokens", {}))
# The padded upstream grouping a call's inputs 4 by 4 in arrival order (TEI's candle backend on
# CPU): 1 ms per call + 40 us per padded token, one call at a time.
PADDED_BASE_MS, PADDED_PER_TOKEN_US, PADDED_GROUP = 1, 40, 4
# The GPU-like upstream, unpadded: 5 ms + 20 us per input + 1 us per token.
UNPADDED_PER_TOKEN_US = 1
TOKEN_IN_FLIGHT = 64
# The CPU model: a 60 s timeout (the requests' deadline) and MAX_QUEUE_DELAY 60s in both modes,
# so that the closed loop measures throughput, not how a client spinning on 429s (load shedding
# when count batching's calls take seconds) starves the model of CPU.
TOKEN_CPU_TIMEOUT_S = 60
TOKEN_CPU_WORKER = {"MAX_QUEUE_DELAY": "60s"}
TOKEN_OPEN_SHARE = 0.8  # open loop at this share of count batching's closed-loop capacity

SCENARIOS += [("token_batching", "19. Mixed lengths: batches sized and shaped by tokens "
                                 "against batches by input counts")]
SCENARIO_NAMES += ["token_batching"]


def mixed_corpus_path() -> str:
    return str(REPO / "loadtest" / "corpus" / "mixed-lengths.txt")


def token_part(b: Stack, part: str, start_worker, rounds: int, open_loop: bool,
               warmup: float, duration: float, timeout: float) -> tuple[list[dict], dict]:
    """Closed loop (TOKEN_IN_FLIGHT requests) then, with `open_loop`, open loop at
    TOKEN_OPEN_SHARE of each mode's best closed-loop goodput (its capacity), both modes at both
    rates, for each mode of TOKEN_MODES in turn (reversed every other round), `rounds` times; a
    fresh worker per run. Returns
    the runs (open ones with `at`, the mode whose capacity set the rate) and one worker's
    settings per mode."""
    corpus = mixed_corpus_path()
    runs, settings = [], {}

    def one(mode: str, env: dict, load: str, rnd: int, rate: float | None,
            at: str | None = None) -> dict:
        mark = b.sup.mark()
        try:
            nats, w = start_worker(env)
            settings[mode] = w.settings
            label = f"{part} {mode} {load}" + (f" {rate:.0f}/s" if rate else "")
            r = b.load(label, nats.target(), rate=rate,
                       concurrency=None if rate else TOKEN_IN_FLIGHT, warmup=warmup,
                       duration=duration, timeout=timeout, corpus=corpus, truncate=True,
                       workers=[w])
        finally:
            b.sup.stop_since(mark)
        return run_entry(mode, {"part": part, "mode": mode, "load": load, "round": rnd,
                                "rate": rate, "at": at}, r)

    def modes(rnd: int):
        """The modes in turn, the order reversed every other round (drift cancels out)."""
        return TOKEN_MODES if rnd % 2 == 0 else TOKEN_MODES[::-1]

    for rnd in range(rounds):
        for mode, env in modes(rnd):
            runs.append(one(mode, env, "closed", rnd, None))
    if open_loop:
        rates = []
        for at, _ in TOKEN_MODES:
            capacity = max(goodput(run["report"]) for run in runs if run["mode"] == at)
            if capacity > 0:
                rates.append((at, TOKEN_OPEN_SHARE * capacity))
        for rnd in range(rounds):
            for at, rate in rates:
                for mode, env in modes(rnd):
                    runs.append(one(mode, env, "open", rnd, rate, at))
    return runs, settings


def scenario_token_batching(b: Stack) -> dict:
    """The built-in model (padded, CPU), the padded upstream double grouping by 4 in arrival
    order, and the GPU-like unpadded double: goodput, p50/p99 and the padding ratio, count
    batching against token batching, alternating in one run."""
    rounds = 2 if not b.quick else 1
    runs, settings = [], {}

    def builtin(env):
        nats = b.nats()
        w = b.worker(nats, model=True, **{**TOKEN_CPU_WORKER, **env})
        b.wait_workers(nats, [w], timeout=180)
        return nats, w

    def padded(env):
        nats = b.nats()
        _, up = b.fake_upstream(PADDED_BASE_MS, 0, 1, extra=(
            "--per-token-us", str(PADDED_PER_TOKEN_US), "--pad-group", str(PADDED_GROUP)))
        w = b.worker(nats, tei_url=up, **env)
        b.wait_workers(nats, [w])
        return nats, w

    def unpadded(env):
        nats = b.nats()
        _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1, extra=(
            "--per-token-us", str(UNPADDED_PER_TOKEN_US)))
        w = b.worker(nats, tei_url=up, **env)
        b.wait_workers(nats, [w])
        return nats, w

    # The CPU model is slow on a small machine: longer windows and a longer timeout, so that
    # count batching's calls (32 inputs padded to the longest) complete within the window.
    timings = {"builtin": (b.d(5, 3), b.d(20, 10), TOKEN_CPU_TIMEOUT_S)}
    for part, start, open_loop in (("builtin", builtin, True), ("padded_double", padded, True),
                                   ("unpadded_double", unpadded, False)):
        warmup, duration, timeout = timings.get(part, (b.d(3, 1), b.d(15, 4), LONG_TIMEOUT_S))
        part_runs, part_settings = token_part(b, part, start, rounds, open_loop, warmup,
                                              duration, timeout)
        runs += part_runs
        settings[part] = {"timing": {"warmup_s": warmup, "duration_s": duration,
                                     "timeout_s": timeout}, **part_settings}
    return {"settings": {"worker": settings["builtin"]["count"], "workers": settings,
                         "corpus": "loadtest/corpus/mixed-lengths.txt",
                         "in_flight": TOKEN_IN_FLIGHT, "open_share": TOKEN_OPEN_SHARE,
                         "padded_upstream": f"fake-upstream {PADDED_BASE_MS} ms + "
                                            f"{PADDED_PER_TOKEN_US} us/padded token, groups of "
                                            f"{PADDED_GROUP} in arrival order, concurrency 1",
                         "unpadded_upstream": f"{GPU_UPSTREAM} + {UNPADDED_PER_TOKEN_US} us/token",
                         "rounds": rounds},
            "runs": runs}


SCENARIO_FUNCS["token_batching"] = scenario_token_batching
# The bulk-job scenarios (OpenAI's Files + Batches API) live in bulk.py, which appends them to
# SCENARIOS and SCENARIO_FUNCS; imported last, once everything it uses here is defined.
from . import bulk  # noqa: E402,F401
# The cache scenario (the workers' cache on and off) lives in cache.py, likewise.
from . import cache  # noqa: E402,F401
# The steady-state A/B scenario lives in steady.py, likewise.
from . import steady  # noqa: E402,F401
# The two-models scenario lives in twomodels.py, likewise.
from . import twomodels  # noqa: E402,F401
# The tenants scenario lives in tenants.py, likewise.
from . import tenants  # noqa: E402,F401
# The retrieval scenario (rerank and sparse embeddings) lives in retrieval.py, likewise.
from . import retrieval  # noqa: E402,F401
