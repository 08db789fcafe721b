"""The retrieval scenario: RAG clients reranking and sparse-embedding through embatch against the
upstream called directly, on the GPU-like fake serving as a reranker and as a SPLADE model.

Kept apart from scenarios.py: this module adds its scenario to SCENARIOS / SCENARIO_FUNCS
(scenarios.py imports it last) and its renderer to render.py's tables."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

from . import scenarios as sc
from .procs import NO_PROXY_OPENER, REPO, BenchError
from .report import failures, fmt_ms, fmt_rate, lat, throughput
from .stack import Stack, Target

CLIENTS = 64  # RAG clients, closed loop: each sends its next request when the last is answered
PAIRS = 20  # documents per query (/rerank), texts per request (/embed_sparse)
# (kind, the fake upstream's flag, the route's path, embatch-loadtest's --route, a probe body)
KINDS = (
    ("rerank", "--reranker", "/rerank", "rerank", {"query": "q", "texts": ["a", "b"]}),
    ("sparse", "--splade", "/embed_sparse", "embed-sparse", {"inputs": ["a", "b"]}),
)


def http_post_json(url: str, body: dict, timeout: float = 2.0) -> int:
    """The status of POSTing `body` as JSON to `url` (0 when nothing answered)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with NO_PROXY_OPENER.open(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_route(url: str, body: dict, timeout: float = 20.0) -> None:
    """Until `url` answers `body` with 200: the gateway serves a route once it has learnt a
    worker's capabilities."""
    deadline, status = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        status = http_post_json(url, body)
        if status == 200:
            return
        time.sleep(0.2)
    raise BenchError(f"{url} still answers {status} after {timeout:g} s")


def scenario_retrieval(b: Stack) -> dict:
    warmup, duration = b.d(2, 1), b.d(10, 3)
    runs, worker_settings = [], {}
    for kind, flag, path, route, probe in KINDS:
        mark = b.sup.mark()
        try:
            nats = b.nats()
            _, up = b.fake_upstream(sc.GPU_BASE_MS, sc.GPU_PER_INPUT_US, 1, extra=[flag])
            w = b.worker(nats, tei_url=up)
            b.wait_workers(nats, [w])
            _, gw = b.gateway(nats, sc.secs(sc.TIMEOUT_S))
            gw_url = gw.args[1].rsplit("/", 1)[0] + path
            wait_route(gw_url, probe)
            for target in (Target("direct", ["--url", up + path]),
                           Target("gateway", ["--url", gw_url])):
                r = b.load(f"{kind} {target.path} c={CLIENTS} k={PAIRS}", target,
                           concurrency=CLIENTS, inputs_per_request=PAIRS, warmup=warmup,
                           duration=duration, timeout=sc.TIMEOUT_S,
                           extra_args=["--route", route],
                           workers=[w] if target.path != "direct" else ())
                runs.append(sc.run_entry(f"{kind} {target.path}",
                                         {"kind": kind, "path": target.path}, r))
            worker_settings = w.settings
        finally:
            b.sup.stop_since(mark)
    return {"settings": {"upstream": sc.GPU_UPSTREAM, "worker": worker_settings,
                         "gateway": {"REQUEST_TIMEOUT": sc.secs(sc.TIMEOUT_S)},
                         "timeout_s": sc.TIMEOUT_S, "warmup_s": warmup, "duration_s": duration,
                         "clients": CLIENTS, "pairs": PAIRS,
                         "direct_capacity_req_s": 1.0 / (sc.GPU_BASE_MS / 1e3
                                                         + PAIRS * sc.GPU_PER_INPUT_US / 1e6)},
            "runs": runs}


BUILTIN_CLIENTS = (1, 8)  # closed loops on the built-in SPLADE model (CPU): alone, and callers


def splade_dir() -> str:
    """The built-in SPLADE model's directory (scripts/fetch-model.sh --model splade-tiny)."""
    out = subprocess.run([str(REPO / "scripts" / "fetch-model.sh"), "--model", "splade-tiny"],
                         cwd=REPO, check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def scenario_retrieval_builtin(b: Stack) -> dict:
    """Sparse embeddings on the built-in SPLADE model through the gateway, 1 and 8 callers."""
    warmup, duration = b.d(2, 1), b.d(10, 3)
    runs, worker_settings = [], {}
    mark = b.sup.mark()
    try:
        nats = b.nats()
        w = b.worker(nats, model=True, model_dir=splade_dir())
        b.wait_workers(nats, [w])
        _, gw = b.gateway(nats, sc.secs(sc.LONG_TIMEOUT_S))
        url = gw.args[1].rsplit("/", 1)[0] + "/embed_sparse"
        wait_route(url, {"inputs": ["a", "b"]}, timeout=60)
        for clients in BUILTIN_CLIENTS:
            r = b.load(f"sparse built-in c={clients} k={PAIRS}", Target("gateway", ["--url", url]),
                       concurrency=clients, inputs_per_request=PAIRS, warmup=warmup,
                       duration=duration, timeout=sc.LONG_TIMEOUT_S,
                       extra_args=["--route", "embed-sparse"], workers=[w])
            runs.append(sc.run_entry(f"sparse built-in c={clients}",
                                     {"kind": "sparse", "path": "gateway", "clients": clients}, r))
        worker_settings = w.settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"upstream": "built-in SPLADE model (splade-tiny, MODEL_DIR), CPU",
                         "worker": worker_settings, "timeout_s": sc.LONG_TIMEOUT_S,
                         "warmup_s": warmup, "duration_s": duration, "pairs": PAIRS},
            "runs": runs}


sc.SCENARIOS += [("retrieval", "R1. Retrieval: rerank and sparse embeddings, 64 RAG clients × "
                               "20 documents, through embatch and direct"),
                 ("retrieval_builtin", "R2. Sparse embeddings on the built-in SPLADE model, "
                                       "20 texts a request")]
sc.SCENARIO_NAMES += ["retrieval", "retrieval_builtin"]
sc.SCENARIO_FUNCS["retrieval"] = scenario_retrieval
sc.SCENARIO_FUNCS["retrieval_builtin"] = scenario_retrieval_builtin


# ---- rendering (render.py adds these) ----

def render_retrieval(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    w = s["worker"]
    batch = int(w["MAX_BATCH_SIZE"])
    out = [f"The fake upstream ({s['upstream']}, a pair or a text being one input) serving as a "
           f"reranker (`--reranker`: TEI's `/rerank`) and as a SPLADE model (`--splade`: "
           f"`/embed_sparse`); one worker on it (MAX_BATCH_SIZE {batch} inputs, MAX_WAIT_TIME "
           f"{w['MAX_WAIT_TIME']}, MAX_CONCURRENT_BATCHES {w['MAX_CONCURRENT_BATCHES']}) and the "
           f"gateway. {s['clients']} clients in a closed loop, each request 1 query × "
           f"{s['pairs']} distinct documents (rerank) or {s['pairs']} distinct texts (sparse); "
           f"{s['warmup_s']:g} s warm-up, {s['duration_s']:g} s measured, "
           f"{s['timeout_s']:g} s timeout. The upstream called directly gets one request per "
           f"call (at most {s['direct_capacity_req_s']:,.0f} req/s, "
           f"{s['direct_capacity_req_s'] * s['pairs']:,.0f} pairs/s); through embatch the "
           f"worker packs several clients' pairs into calls of {batch} inputs (at most "
           f"{sc.ceiling(batch):,.0f} inputs/s), a request's {s['pairs']} pairs spanning two "
           f"calls where needed. Mean batch = inputs per upstream call over the measured window. "
           f"Only the fake is measured: no cross-encoder ships in a package the built-in "
           f"model can load, and its SPLADE model (splade-tiny) runs on CPU: R2.", "",
           "| route | path | req/s | pairs or texts/s | × direct | mean batch inputs | "
           "p50 ms | p99 ms | failures |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for kind in ("rerank", "sparse"):
        direct = next((run["report"] for run in res["runs"]
                       if run["kind"] == kind and run["path"] == "direct"), None)
        for run in (run for run in res["runs"] if run["kind"] == kind):
            r = run["report"]
            mb = (r.get("batches") or {}).get("mean_batch_inputs")
            gain = (f"{throughput(r) / throughput(direct):.2f}"
                    if direct and throughput(direct) and run["path"] != "direct" else "-")
            out.append(f"| {kind} | {run['path']} | {fmt_rate(throughput(r))} | "
                       f"{fmt_rate(r['throughput']['inputs_per_s'])} | {gain} | "
                       f"{'-' if mb is None else f'{mb:.1f}'} | {fmt_ms(lat(r, 'p50_ms'))} | "
                       f"{fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} |")
    return out


def render_retrieval_builtin(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    w = s["worker"]
    out = [f"One worker on the {s['upstream']} (MAX_BATCH_SIZE "
           f"{w.get('MAX_BATCH_SIZE', 'default')}, MAX_WAIT_TIME "
           f"{w.get('MAX_WAIT_TIME', 'default')}) and the gateway. Closed loops of 1 and 8 "
           f"callers, each request {s['pairs']} distinct texts to `/embed_sparse`; "
           f"{s['warmup_s']:g} s warm-up, {s['duration_s']:g} s measured, {s['timeout_s']:g} s "
           f"timeout. The model runs in the worker's process, on the same CPU cores as "
           f"everything else: there is no upstream to call directly. On a CPU a batch costs "
           f"about its tokens, so callers sharing batches gain little throughput, unlike on a "
           f"GPU (R1).", "",
           "| callers | req/s | texts/s | mean batch inputs | p50 ms | p99 ms | failures |",
           "|---:|---:|---:|---:|---:|---:|---|"]
    for run in res["runs"]:
        r = run["report"]
        mb = (r.get("batches") or {}).get("mean_batch_inputs")
        out.append(f"| {run['clients']} | {fmt_rate(throughput(r))} | "
                   f"{fmt_rate(r['throughput']['inputs_per_s'])} | "
                   f"{'-' if mb is None else f'{mb:.1f}'} | {fmt_ms(lat(r, 'p50_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} |")
    return out


RENDERERS = {"retrieval": render_retrieval, "retrieval_builtin": render_retrieval_builtin}
SHOWS = {"retrieval": "What batching across callers gains on rerank and sparse-embedding calls: "
                      "RAG clients each sending a query with 20 documents, through embatch "
                      "against the upstream called directly.",
         "retrieval_builtin": "Sparse embeddings served by the built-in model (a real SPLADE "
                              "model, on CPU) through embatch, alone and with callers sharing "
                              "its batches."}
