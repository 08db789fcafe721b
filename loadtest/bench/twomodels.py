"""Two models served at once: each model's goodput, p50/p99 and failures when it runs alone and
when both run together, behind one gateway.

Kept apart from scenarios.py (like cache.py): this module adds its scenario to SCENARIOS /
SCENARIO_FUNCS (scenarios.py imports it last) and its renderer to render.py's tables.

The stack: nats-server with JetStream, two GPU-like fake upstreams (one GPU each), worker A on
the first as model `model-a` (MODEL_ALIAS) and worker B on the second as `model-b`, both with
EMBATCH_DEFAULT_MODEL=model-a and the cache off (CACHE=false: the numbers measure serving, not
the cache), and one gateway with EMBATCH_DEFAULT_MODEL=model-a. The load goes to the gateway's
`/embed` with `Embatch-Model: <model>` (`embatch-loadtest run --model`), the header the gateway
routes TEI requests by, as it routes OpenAI's `model` field: each model's requests go to its
model subject `<subject>.<token>`, so to its own workers."""

from __future__ import annotations

import json
import os
import threading
import time

from . import scenarios as sc
from .procs import BenchError, free_port, http_get, log, port_open, wait_until
from .report import failures, fmt_ms, goodput, lat
from .stack import Nats, Stack, Target

MODELS = ("model-a", "model-b")
DEFAULT_MODEL = MODELS[0]
TWO_MODELS_WORKER = {"CACHE": "false", "EMBATCH_DEFAULT_MODEL": DEFAULT_MODEL}
# The second load generator starts this long after the first, so the two `Stack.load` calls
# never number their report files at the same instant (it is not thread-safe); negligible
# against the measured window.
STAGGER_S = 0.05

sc.SCENARIOS += [("two_models", "M1. Two models served at once, mixed load: each model alone "
                                "and together")]
sc.SCENARIO_NAMES += ["two_models"]


def subscribers(nats: Nats, subject: str) -> int:
    """Subscriptions on exactly `subject` (from nats-server's monitoring `/subsz`); -1 when the
    monitor does not answer."""
    status, body = http_get(f"http://127.0.0.1:{nats.monitor_port}/subsz?subs=1&limit=100000")
    if status != 200:
        return -1
    subs = json.loads(body).get("subscriptions_list") or []
    return sum(1 for s in subs if s.get("subject") == subject)


def model_subject(subject: str, model: str) -> str:
    """`<subject>.<model>`: the model subject of a name made of letters, digits and `-` only
    (which the token encoding leaves as they are)."""
    if not all(c.isalnum() or c == "-" for c in model):
        raise BenchError(f"model name {model!r} would need encoding")
    return f"{subject}.{model}"


def gateway(b: Stack, nats: Nats) -> tuple[object, Target, str]:
    """The gateway with the bench's REQUEST_TIMEOUT and EMBATCH_DEFAULT_MODEL; its /embed target
    and its base URL."""
    port = free_port(b.ports)
    env = {"NATS_URL": nats.url, "LISTEN_ADDR": f"127.0.0.1:{port}",
           "REQUEST_TIMEOUT": sc.secs(sc.TIMEOUT_S), "EMBATCH_DEFAULT_MODEL": DEFAULT_MODEL}
    child = b.sup.spawn("gateway", [b.bins["embatch-gateway"]], b.env(env))
    wait_until("the gateway to listen", lambda: port_open(port), 15, [child])
    base = f"http://127.0.0.1:{port}"
    return child, Target("gateway", ["--url", f"{base}/embed"]), base


def listed_models(base: str) -> set[str]:
    status, body = http_get(f"{base}/v1/models")
    if status != 200:
        return set()
    return {m.get("id") for m in json.loads(body).get("data") or []}


def with_model(target: Target, model: str) -> Target:
    return Target(target.path, [*target.args, "--model", model])


def scenario_two_models(b: Stack) -> dict:
    rates = [sc.RECOVERY_RATE, round(sc.ceiling(b.defaults.max_batch_size) / 2)]
    warmup, duration = b.d(2, 1), b.d(15, 4)
    runs = []
    mark = b.sup.mark()
    try:
        nats = b.nats()
        workers = {}
        for model, tag in zip(MODELS, ("A", "B")):
            _, up = b.fake_upstream(sc.GPU_BASE_MS, sc.GPU_PER_INPUT_US, 1,
                                    name=f"fake-upstream-{tag}")
            workers[model] = b.worker(nats, tei_url=up, name=f"worker-{tag}",
                                      MODEL_ALIAS=model, **TWO_MODELS_WORKER)
        children = [w.child for w in workers.values()]
        for model, w in workers.items():
            subject = model_subject(nats.subject, model)
            wait_until(f"a worker on {subject}", lambda s=subject: subscribers(nats, s) == 1,
                       30, children)
            wait_until("worker /metrics", lambda w=w: port_open(w.metrics_port), 10, children)
        _, gw, base = gateway(b, nats)
        wait_until("the gateway to list both models",
                   lambda: set(MODELS) <= listed_models(base), 15, children)
        listed = sorted(listed_models(base))
        log(f"  GET /v1/models: {listed}")

        def one(model: str, rate: int, mode: str, out: dict) -> None:
            loadavg = os.getloadavg()[0]
            try:
                r = b.load(f"{model} {mode} @ {rate} req/s", with_model(gw, model), rate=rate,
                           warmup=warmup, duration=duration, timeout=sc.TIMEOUT_S,
                           workers=[workers[m] for m in MODELS])
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
                out[model] = e
                return
            out[model] = sc.run_entry(f"{model} {mode}", {"model": model, "mode": mode,
                                                           "rate": rate,
                                                           "loadavg_before": loadavg}, r)

        for rate in rates:
            for model in MODELS:
                out: dict = {}
                one(model, rate, "alone", out)
                runs.append(out[model])
            out = {}
            threads = []
            for model in MODELS:
                t = threading.Thread(target=one, args=(model, rate, "together", out))
                t.start()
                threads.append(t)
                time.sleep(STAGGER_S)
            for t in threads:
                t.join()
            for model in MODELS:
                if isinstance(out.get(model), BaseException):
                    raise out[model]
                runs.append(out[model])
    finally:
        b.sup.stop_since(mark)
    worker_settings = {k: v for k, v in next(iter(workers.values())).settings.items()
                       if k not in ("TEI_URL", "MODEL_ALIAS")}
    return {"settings": {"upstream": f"one {sc.GPU_UPSTREAM} per model", "models": list(MODELS),
                         "listed": listed, "worker": worker_settings,
                         "gateway": {"REQUEST_TIMEOUT": sc.secs(sc.TIMEOUT_S),
                                     "EMBATCH_DEFAULT_MODEL": DEFAULT_MODEL},
                         "timeout_s": sc.TIMEOUT_S, "warmup_s": warmup, "duration_s": duration,
                         "rates": rates, "ceiling": sc.ceiling(b.defaults.max_batch_size)},
            "runs": runs}


sc.SCENARIO_FUNCS["two_models"] = scenario_two_models


# ---- rendering (render.py adds these) ----

def by_worker(r: dict, key: str) -> list:
    """`key` of each worker's batch figures over the measured window, in MODELS' order."""
    return [(b or {}).get(key) for b in r.get("batches_by_worker") or [None] * len(MODELS)]


def render_two_models(res: dict, targets: list) -> list[str]:
    """Per rate and model: goodput, p50/p99, failures and mean batch alone and together, the
    goodput together / alone, and the inputs each model's worker sent upstream in the window
    (alone, the other model's worker sends none: the requests went to their own model)."""
    s = res["settings"]
    out = [f"Two models, `{s['models'][0]}` and `{s['models'][1]}` (MODEL_ALIAS), each served "
           f"by one worker on its own {sc.GPU_UPSTREAM} (full-batch ceiling "
           f"~{s['ceiling']:,.0f} req/s each); workers with their batching defaults, CACHE "
           f"off and EMBATCH_DEFAULT_MODEL={s['gateway']['EMBATCH_DEFAULT_MODEL']}; one gateway "
           f"(REQUEST_TIMEOUT {s['gateway']['REQUEST_TIMEOUT']}, the same default model), "
           f"NATS with JetStream. Open loop, single-input requests to the gateway's `/embed` "
           f"with `Embatch-Model: <model>` (`embatch-loadtest run --model`), one load "
           f"generator per model, {s['warmup_s']:g} s warm-up and {s['duration_s']:g} s "
           f"measured, {s['timeout_s']:g} s timeout: each model alone, then both at once at "
           f"the same rate each. Load average: the 1-minute one when the run started. Inputs "
           f"upstream: what each model's worker sent its upstream in the measured window (the "
           f"two load generators' windows coincide within {STAGGER_S * 1e3:g} ms); mean batch: "
           f"inputs per upstream call of the run's own model's worker.", "",
           "| rate per model req/s | model | run | load avg | goodput req/s | together / "
           "alone | p50 ms | p99 ms | failures | mean batch | inputs upstream "
           f"{s['models'][0]} / {s['models'][1]} |",
           "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    alone = {(run["rate"], run["model"]): goodput(run["report"]) for run in res["runs"]
             if run["mode"] == "alone"}
    for run in res["runs"]:
        r = run["report"]
        ratio = "-"
        if run["mode"] == "together" and alone.get((run["rate"], run["model"])):
            ratio = f"{goodput(r) / alone[(run['rate'], run['model'])]:.3f}"
        own = s["models"].index(run["model"])
        batch = by_worker(r, "mean_batch_inputs")[own]
        inputs = " / ".join("-" if x is None else f"{x:,.0f}" for x in by_worker(r, "inputs"))
        out.append(f"| {run['rate']:,} | {run['model']} | {run['mode']} | "
                   f"{run['loadavg_before']:.2f} | {goodput(r):,.0f} | {ratio} | "
                   f"{fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} | "
                   f"{'-' if batch is None else f'{batch:.1f}'} | {inputs} |")
    return out


RENDERERS = {"two_models": render_two_models}
SHOWS = {"two_models": "That two models behind one gateway are served apart: each model's "
                       "goodput, p50/p99 and failures when it runs alone and when both run at "
                       "once, each on its own workers and upstream."}
