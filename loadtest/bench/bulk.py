"""Bulk embedding jobs (OpenAI's Files + Batches API on JetStream): the bench's bulk scenarios.

Kept apart from scenarios.py: this module adds its scenarios to SCENARIOS / SCENARIO_FUNCS
(scenarios.py imports it last) and its renderers to render.py's tables.

- bulk_alone: a 100k-input job alone on the GPU-like upstream: inputs/s against the upstream's
  full-batch ceiling;
- bulk_interactive: an interactive open loop at 50% of that ceiling, without and then with a
  bulk backlog: interactive p50/p99 and 429s, and the bulk job's inputs/s in the same window;
- bulk_faults: a 100k-input job on two workers, once undisturbed and once with worker B
  `kill -9`ed and nats-server restarted (store kept) during it: inputs lost, custom_ids
  duplicated, time added;
- bulk_sdk: a 10,000-input job on the built-in model through the unmodified `openai` SDK
  (tests/clients/openai_batch.py), every vector compared with /v1/embeddings.

The jobs are driven over HTTP with the standard library (multipart upload written here); the
progress of a job is its `request_counts`, polled every POLL_S.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

from . import scenarios as sc
from .procs import NO_PROXY_OPENER, REPO, BenchError, log
from .report import failures, fmt_ms, lat
from .stack import Stack, batch_stats

POLL_S = 0.2
# Inputs per batch request line: 100k inputs in 25,000 lines, under OpenAI's (and the
# gateway's default) 50,000 requests per file.
INPUTS_PER_LINE = 4
BULK_INPUTS = 100_000
QUICK_BULK_INPUTS = 20_000
SDK_INPUTS = 10_000
QUICK_SDK_INPUTS = 1_000
FINAL = {"completed", "failed", "expired", "cancelled"}
# Interactive load, as shares of the full-batch ceiling: the 50% first (its targets).
INTERACTIVE_SHARES = (0.5, 0.25)


class Gateway:
    """The gateway's Files + Batches routes, standard library only."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with NO_PROXY_OPENER.open(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, payload: dict | None = None) -> dict:
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"content-type": "application/json"} if body is not None else {}
        status, out = self.call(method, path, body, headers)
        if status // 100 != 2:
            raise BenchError(f"{method} {path}: {status} {out[:300]!r}")
        return json.loads(out)

    def model(self) -> str:
        return self.json("GET", "/info")["model_id"]

    def upload(self, name: str, jsonl: bytes) -> str:
        boundary = uuid.uuid4().hex
        body = b"".join([
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"batch\r\n".encode(),
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n".encode(),
            jsonl, f"\r\n--{boundary}--\r\n".encode()])
        status, out = self.call("POST", "/v1/files", body,
                                {"content-type": f"multipart/form-data; boundary={boundary}"},
                                timeout=300)
        if status // 100 != 2:
            raise BenchError(f"POST /v1/files: {status} {out[:300]!r}")
        return json.loads(out)["id"]

    def create(self, file_id: str) -> dict:
        return self.json("POST", "/v1/batches", {
            "input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h",
            "metadata": {"bench": "loadtest/bench/bulk.py"}})

    def content(self, file_id: str) -> bytes:
        status, out = self.call("GET", f"/v1/files/{file_id}/content", timeout=600)
        if status != 200:
            raise BenchError(f"GET /v1/files/{file_id}/content: {status} {out[:300]!r}")
        return out


def job_lines(model: str, inputs: int, tag: str) -> tuple[bytes, list[str]]:
    """The JSONL of a job of `inputs` short inputs, INPUTS_PER_LINE per line; and its custom_ids."""
    lines, ids = [], []
    for start in range(0, inputs, INPUTS_PER_LINE):
        cid = f"{tag}-{start}"
        ids.append(cid)
        texts = [f"bulk item {i} of {tag}" for i in range(start, min(inputs,
                                                                     start + INPUTS_PER_LINE))]
        lines.append(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/embeddings",
                                 "body": {"model": model, "input": texts}},
                                separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode(), ids


class Follower:
    """Polls a batch every POLL_S on a thread: its timeline of (unix s, status, completed,
    failed) requests; `hooks` are (fraction of requests done, action) run once each when the job
    passes them. A poll that fails (the gateway or NATS restarting) is counted and retried."""

    def __init__(self, gw: Gateway, batch_id: str, total: int,
                 hooks: list[tuple[float, str, object]] = (), poll_s: float = POLL_S):
        self.gw, self.batch_id, self.total, self.poll_s = gw, batch_id, total, poll_s
        self.hooks = sorted(hooks, key=lambda h: h[0])
        self.timeline: list[tuple[float, str, int, int]] = []
        self.fired: list[dict] = []
        self.poll_errors = 0
        self.batch: dict | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                b = self.gw.json("GET", f"/v1/batches/{self.batch_id}")
            except (BenchError, OSError, ValueError):
                self.poll_errors += 1
                time.sleep(self.poll_s)
                continue
            c = b.get("request_counts") or {}
            now = time.time()
            self.batch = b
            self.timeline.append((now, b["status"], c.get("completed", 0), c.get("failed", 0)))
            done = (c.get("completed", 0) + c.get("failed", 0)) / max(1, self.total)
            while self.hooks and done >= self.hooks[0][0]:
                frac, name, action = self.hooks.pop(0)
                log(f"bulk: {name} at {done:.0%} of the job")
                try:
                    action()
                    self.fired.append({"name": name, "at_fraction": round(done, 3),
                                       "unix_ms": int(time.time() * 1e3), "error": None})
                except Exception as e:  # noqa: BLE001 - recorded, the scenario fails on it
                    self.fired.append({"name": name, "at_fraction": round(done, 3),
                                       "unix_ms": int(time.time() * 1e3), "error": str(e)})
            if b["status"] in FINAL:
                return
            time.sleep(self.poll_s)

    def wait(self, timeout: float) -> dict | None:
        """The final batch, or None when it is not final after `timeout` s (still followed)."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            return None
        return self.batch or {}

    def requests_at(self, t: float) -> float:
        """Requests done at unix time `t`, interpolated along the timeline."""
        pts = [(ts, c + f) for ts, _, c, f in self.timeline]
        if not pts or t <= pts[0][0]:
            return float(pts[0][1]) if pts else 0.0
        for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
            if t0 <= t <= t1:
                return d0 + (d1 - d0) * (t - t0) / max(1e-9, t1 - t0)
        return float(pts[-1][1])

    def time_at(self, requests: float) -> float | None:
        """Unix time the job reached `requests` done, interpolated."""
        pts = [(ts, c + f) for ts, _, c, f in self.timeline]
        for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
            if d0 <= requests <= d1 and d1 > d0:
                return t0 + (t1 - t0) * (requests - d0) / (d1 - d0)
        return None


CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"([^"\\]*)"')


def count_output(data: bytes, ids: list[str], inputs_of: dict[str, int]) -> dict:
    """Lines, custom_ids seen once / more than once / never, and inputs with a vector."""
    seen: dict[str, int] = {}
    vectors = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        m = CUSTOM_ID.search(line)
        cid = m.group(1).decode() if m else "?"
        seen[cid] = seen.get(cid, 0) + 1
        if seen[cid] == 1:
            body = json.loads(line)["response"]["body"]
            vectors += len(body["data"])
    expected = set(ids)
    return {"lines": sum(seen.values()),
            "duplicated_custom_ids": sum(n - 1 for n in seen.values() if n > 1),
            "missing_custom_ids": len(expected - seen.keys()),
            "unknown_custom_ids": len(seen.keys() - expected),
            "inputs_lost": sum(inputs_of[c] for c in expected - seen.keys()),
            "vectors": vectors}


def run_job(gw: Gateway, inputs: int, tag: str, timeout: float,
            hooks: list = (), before_follow=None, poll_s: float = POLL_S) -> dict:
    """Uploads, creates and follows one job to its end; downloads and counts its output."""
    model = gw.model()
    jsonl, ids = job_lines(model, inputs, tag)
    inputs_of = {cid: min(INPUTS_PER_LINE, inputs - i * INPUTS_PER_LINE)
                 for i, cid in enumerate(ids)}
    t0 = time.time()
    file_id = gw.upload(f"{tag}.jsonl", jsonl)
    t_uploaded = time.time()
    batch = gw.create(file_id)
    t_created = time.time()
    follower = Follower(gw, batch["id"], len(ids), hooks, poll_s)
    if before_follow is not None:
        before_follow(follower)
    final = follower.wait(timeout)
    stuck = None
    if final is None:
        # Not final in time: recorded as such, then cancelled so that what finished is still
        # delivered and counted.
        stuck = {"after_s": timeout, "status": follower.timeline[-1][1],
                 "requests_done": follower.timeline[-1][2] + follower.timeline[-1][3]}
        log(f"bulk: batch {batch['id']} not final after {timeout:.0f} s ({stuck}); cancelling")
        gw.json("POST", f"/v1/batches/{batch['id']}/cancel")
        final = follower.wait(120)
        if final is None:
            follower.stop.set()
            raise BenchError(f"batch {batch['id']} not final 120 s after its cancel")
    t_final = follower.timeline[-1][0] if follower.timeline else time.time()
    out = {"not_final_in_time": stuck, "inputs": inputs, "requests": len(ids),
           "inputs_per_request": INPUTS_PER_LINE,
           "upload_bytes": len(jsonl), "upload_s": t_uploaded - t0,
           "job_s": t_final - t_created, "status": final.get("status"),
           "request_counts": final.get("request_counts"), "poll_errors": follower.poll_errors,
           "events": follower.fired}
    # Steady rate: from 10% to 90% of the requests done.
    t10, t90 = follower.time_at(0.1 * len(ids)), follower.time_at(0.9 * len(ids))
    if t10 is not None and t90 is not None and t90 > t10:
        out["steady_inputs_per_s"] = 0.8 * inputs / (t90 - t10)
    out["overall_inputs_per_s"] = inputs / out["job_s"] if out["job_s"] > 0 else None
    if final.get("output_file_id"):
        t = time.time()
        out.update(count_output(gw.content(final["output_file_id"]), ids, inputs_of))
        out["download_and_count_s"] = time.time() - t
    if final.get("error_file_id"):
        out["error_lines"] = len([x for x in gw.content(final["error_file_id"]).splitlines()
                                  if x.strip()])
    out["_follower"] = follower
    return out


def public(job: dict) -> dict:
    return {k: v for k, v in job.items() if not k.startswith("_")}


def bulk_gpu_stack(b: Stack, workers: int = 1, request_timeout: str | None = None):
    """nats-server (JetStream, max_payload 8MB as nats/nats.conf), one GPU-like upstream per
    worker, the workers, the gateway."""
    nats = b.nats(max_payload="8MB")
    ups, ws = sc.gpu_workers(b, nats, ("A", "B")[:workers])
    gw_child, target = b.gateway(nats, request_timeout)
    base = target.args[1].rsplit("/embed", 1)[0]
    return nats, ups, ws, gw_child, target, Gateway(base)


def scenario_bulk_alone(b: Stack) -> dict:
    inputs = QUICK_BULK_INPUTS if b.quick else BULK_INPUTS
    mark = b.sup.mark()
    try:
        _, _, ws, _, _, gw = bulk_gpu_stack(b)
        direct = sc.direct_full_batches(b, ws[0].settings["TEI_URL"], "bulk alone")
        # What one bulk item pays: a one-line job on the idle stack, polled every 10 ms,
        # against single interactive requests.
        single = run_job(gw, 1, "single", timeout=60, poll_s=0.01)
        interactive_ms = []
        for i in range(50):
            t = time.perf_counter()
            status, _ = gw.call("POST", "/embed", json.dumps({"inputs": f"one {i}"}).encode(),
                                {"content-type": "application/json"})
            if status != 200:
                raise BenchError(f"POST /embed answered {status}")
            interactive_ms.append(1e3 * (time.perf_counter() - t))
        interactive_ms.sort()
        before = [w.totals() for w in ws]
        job = run_job(gw, inputs, "alone", timeout=900)
        # What the upstream saw over the whole job: full batches, and calls back to back.
        job["batches"] = batch_stats(before, [w.totals() for w in ws], job["job_s"])
        settings = ws[0].settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"upstream": sc.GPU_UPSTREAM, "worker": settings, "gateway": "defaults",
                         "ceiling_inputs_per_s": sc.ceiling(b.defaults.max_batch_size),
                         "direct_inputs_per_s": sc.direct_inputs_per_s(
                             direct, b.defaults.max_batch_size),
                         "max_batch_size": b.defaults.max_batch_size},
            "runs": [{"label": "bulk alone", "job": public(job)}],
            "one_item": {"job_ms": 1e3 * single["job_s"], "status": single["status"],
                         "interactive_p50_ms": interactive_ms[len(interactive_ms) // 2],
                         "interactive_requests": len(interactive_ms)}}


def scenario_bulk_interactive(b: Stack) -> dict:
    """At each share of the ceiling (the issue's 50%, and 25% where the shared machine's CPU is
    less of a limit): the interactive load alone, then the same load with a backlog under way."""
    ceiling = sc.ceiling(b.defaults.max_batch_size)
    warmup, duration = b.d(2, 1), b.d(15, 5)
    inputs = QUICK_BULK_INPUTS if b.quick else BULK_INPUTS
    mark = b.sup.mark()
    runs = []
    try:
        _, _, ws, _, target, gw = bulk_gpu_stack(b, request_timeout=sc.secs(sc.TIMEOUT_S))
        direct = sc.direct_full_batches(b, ws[0].settings["TEI_URL"], "bulk interactive")
        model = gw.model()
        for share in INTERACTIVE_SHARES:
            rate = share * ceiling
            alone = b.load(f"interactive @ {rate:.0f} req/s, no bulk", target, rate=rate,
                           warmup=warmup, duration=duration, timeout=sc.TIMEOUT_S, workers=ws)
            runs.append({"label": "interactive alone", "share": share, "rate": rate,
                         "report": alone})

            # The backlog: a job submitted and under way before the interactive load starts.
            jsonl, ids = job_lines(model, inputs, f"backlog-{share:g}")
            batch = gw.create(gw.upload(f"backlog-{share:g}.jsonl", jsonl))
            follower = Follower(gw, batch["id"], len(ids))
            deadline = time.monotonic() + 120
            while not follower.timeline or follower.timeline[-1][2] == 0:
                if time.monotonic() > deadline:
                    raise BenchError("the bulk job made no progress in 120 s")
                time.sleep(POLL_S)
            mixed = b.load(f"interactive @ {rate:.0f} req/s + bulk backlog", target, rate=rate,
                           warmup=warmup, duration=duration, timeout=sc.TIMEOUT_S, workers=ws)
            start = mixed["per_second"]["start_unix_ms"] / 1e3
            done = follower.requests_at(start + duration) - follower.requests_at(start)
            finished_inside = (follower.timeline[-1][1] in FINAL
                               and follower.timeline[-1][0] < start + duration)
            gw.json("POST", f"/v1/batches/{batch['id']}/cancel")
            final = follower.wait(120) or {}
            runs.append({"label": "interactive + bulk", "share": share, "rate": rate,
                         "report": mixed,
                         "bulk": {"inputs_per_s_in_window": done * INPUTS_PER_LINE / duration,
                                  "job_finished_inside_window": finished_inside,
                                  "final_status": final.get("status"),
                                  "request_counts": final.get("request_counts"),
                                  "poll_errors": follower.poll_errors}})
        settings = ws[0].settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"upstream": sc.GPU_UPSTREAM, "worker": settings,
                         "gateway": {"REQUEST_TIMEOUT": sc.secs(sc.TIMEOUT_S)},
                         "timeout_s": sc.TIMEOUT_S, "warmup_s": warmup, "duration_s": duration,
                         "ceiling_inputs_per_s": ceiling,
                         "direct_inputs_per_s": sc.direct_inputs_per_s(
                             direct, b.defaults.max_batch_size),
                         "upstream_call_ms": (sc.GPU_BASE_MS + b.defaults.max_batch_size
                                              * sc.GPU_PER_INPUT_US / 1e3),
                         "bulk_inputs": inputs},
            "runs": runs}


def scenario_bulk_faults(b: Stack) -> dict:
    inputs = QUICK_BULK_INPUTS if b.quick else BULK_INPUTS
    mark = b.sup.mark()
    runs = []
    try:
        nats, _, ws, _, _, gw = bulk_gpu_stack(b, workers=2)
        base = run_job(gw, inputs, "undisturbed", timeout=900)
        if base["not_final_in_time"]:
            raise BenchError(f"the undisturbed job did not finish: {base['not_final_in_time']}")
        runs.append({"label": "undisturbed", "job": public(base)})
        hooks = [(0.25, "SIGKILL worker-B", lambda: b.sup.kill(ws[1].child)),
                 (0.5, "restart nats-server (1 s down, store kept)",
                  lambda: sc.restart_nats(b, nats, 1.0))]
        # Time enough for the redeliveries (BULK_ACK_WAIT is 30 s by default) on one worker.
        faulted = run_job(gw, inputs, "faulted", timeout=3 * base["job_s"] + 120, hooks=hooks)
        if any(e["error"] for e in faulted["events"]):
            raise BenchError(f"an event failed: {faulted['events']}")
        runs.append({"label": "worker B kill -9 at 25%, nats-server restart at 50%",
                     "job": public(faulted)})
        settings = ws[0].settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"upstream": f"one {sc.GPU_UPSTREAM} per worker", "worker": settings,
                         "gateway": "defaults",
                         "ceiling_inputs_per_s_per_worker": sc.ceiling(
                             b.defaults.max_batch_size)},
            "runs": runs}


SDK_VENV = REPO / ".bin" / "bulk-sdk-venv"


def sdk_python() -> str:
    """A venv with the `openai` pinned in tests/clients/requirements.txt (created on first use)."""
    pin = next(line.strip() for line in (REPO / "tests/clients/requirements.txt").read_text()
               .splitlines() if line.startswith("openai=="))
    py = SDK_VENV / "bin" / "python"
    marker = SDK_VENV / "installed.txt"
    if not (py.is_file() and marker.is_file() and marker.read_text() == pin):
        log(f"installing {pin} into {SDK_VENV}")
        subprocess.run(["python3", "-m", "venv", str(SDK_VENV)], check=True)
        subprocess.run([str(SDK_VENV / "bin" / "pip"), "install", "--quiet",
                        "--disable-pip-version-check", pin], check=True)
        marker.write_text(pin)
    return str(py)


def scenario_bulk_sdk(b: Stack) -> dict:
    inputs = QUICK_SDK_INPUTS if b.quick else SDK_INPUTS
    py = sdk_python()
    mark = b.sup.mark()
    try:
        nats = b.nats(max_payload="8MB")
        w = b.worker(nats, model=True)
        b.wait_workers(nats, [w], timeout=120)
        _, target = b.gateway(nats, None)
        base = target.args[1].rsplit("/embed", 1)[0]
        started = time.monotonic()
        proc = subprocess.run([py, str(REPO / "tests/clients/openai_batch.py"), base,
                               str(inputs), "3000"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=b.env())
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise BenchError(f"openai_batch.py failed: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        settings = w.settings
    finally:
        b.sup.stop_since(mark)
    result["wall_s"] = wall
    return {"settings": {"upstream": "built-in model (all-MiniLM-L6-v2, CPU)", "worker": settings,
                         "gateway": "defaults", "inputs": inputs},
            "runs": [{"label": "openai SDK", "result": result}]}


# Registration: appended after every other scenario, under names of their own.
sc.SCENARIOS += [
    ("bulk_alone", "B1. Bulk job alone: 100k inputs on the GPU-like upstream"),
    ("bulk_interactive", "B2. Bulk backlog behind interactive traffic at 50% and 25% of "
                         "capacity"),
    ("bulk_faults", "B3. Bulk job through a worker kill -9 and a nats-server restart"),
    ("bulk_sdk", "B4. Bulk job through the openai SDK on the built-in model"),
]
sc.SCENARIO_NAMES += ["bulk_alone", "bulk_interactive", "bulk_faults", "bulk_sdk"]
sc.SCENARIO_FUNCS.update({
    "bulk_alone": scenario_bulk_alone,
    "bulk_interactive": scenario_bulk_interactive,
    "bulk_faults": scenario_bulk_faults,
    "bulk_sdk": scenario_bulk_sdk,
})


# ---- rendering (render.py adds these) ----

def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render_bulk_alone(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    j = res["runs"][0]["job"]
    steady = j.get("steady_inputs_per_s")
    share = steady / s["ceiling_inputs_per_s"] if steady else 0.0
    out = [f"One worker with its defaults on {s['upstream']}; a job of {j['inputs']:,} inputs in "
           f"{j['requests']:,} request lines ({j['inputs_per_request']} inputs each) through "
           f"`POST /v1/files` and `POST /v1/batches`, followed by polling `request_counts` every "
           f"{POLL_S:g} s. The ceiling is the upstream with full batches of "
           f"{s['max_batch_size']}: {s['ceiling_inputs_per_s']:,.0f} inputs/s.", "",
           "| inputs | status | job s (create → completed) | inputs/s overall | inputs/s 10→90% "
           "| share of the ceiling | lost | duplicated |",
           "|---:|---|---:|---:|---:|---:|---:|---:|",
           f"| {j['inputs']:,} | {j['status']} | {j['job_s']:.1f} | "
           f"{rate(j.get('overall_inputs_per_s'))} | {rate(steady)} | {share:.0%} | "
           f"{j.get('inputs_lost', '-')} | {j.get('duplicated_custom_ids', '-')} |"]
    if s.get("direct_inputs_per_s") and steady:
        out += ["", f"Called directly with full batches (two in flight), the same upstream "
                    f"answered {s['direct_inputs_per_s']:,.0f} inputs/s on this machine: the job "
                    f"ran at {steady / s['direct_inputs_per_s']:.0%} of that."]
    st = j.get("batches")
    if st and st.get("mean_batch_inputs"):
        # The upstream's own time for the calls made (the worker's timing includes the wait at
        # a serial upstream behind the other call in flight).
        call_ms = sc.call_ms(st["mean_batch_inputs"])
        busy = st["upstream_calls"] * call_ms / 1e3 / j["job_s"]
        out += ["", f"Over the whole job the worker made {st['upstream_calls']:,.0f} upstream "
                    f"calls of {st['mean_batch_inputs']:.1f} inputs on average (at most "
                    f"{s['max_batch_size']}); at {call_ms:.2f} ms of the upstream's time each, "
                    f"the upstream was busy {busy:.0%} of the job's time (which includes "
                    f"validating the file and writing the output)."]
    targets.append(("bulk alone: inputs/s >= 90% of the full-batch ceiling", f"{share:.0%}",
                    share >= 0.9))
    one = res.get("one_item")
    if one:
        out += ["", f"What one item pays with no other load on the stack: a one-line job went from "
                    f"`POST /v1/batches` to `{one['status']}` in {one['job_ms']:,.0f} ms (polled "
                    f"every 10 ms: validation, one work item, finalization), against a p50 of "
                    f"{fmt_ms(one['interactive_p50_ms'])} ms for "
                    f"{one['interactive_requests']} sequential single-input `POST /embed`."]
    return out


def render_bulk_interactive(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    runs = res["runs"]
    # Results of the first version of this scenario: one share, `rate` in the settings.
    for r in runs:
        r.setdefault("share", s.get("rate", 0) / s["ceiling_inputs_per_s"])
        r.setdefault("rate", s.get("rate"))
    shares = sorted({r["share"] for r in runs}, reverse=True)
    out = [f"One worker with its defaults on {s['upstream']}; the gateway's REQUEST_TIMEOUT "
           f"{s['gateway']['REQUEST_TIMEOUT']}. Open loop of single-input `/embed` requests at a "
           f"share of the {s['ceiling_inputs_per_s']:,.0f} inputs/s ceiling for "
           f"{s['duration_s']:g} s, first alone, then with a {s['bulk_inputs']:,}-input job under "
           f"way (submitted before the load and cancelled after it). One full upstream call: "
           f"{s['upstream_call_ms']:.2f} ms.", "",
           "| interactive load | run | p50 ms | p99 ms | failures | bulk inputs/s | share of the "
           "capacity left |", "|---|---|---:|---:|---|---:|---:|"]
    for share in shares:
        pair = [r for r in runs if r["share"] == share]
        alone = next(r for r in pair if r["label"] == "interactive alone")
        mixed = next(r for r in pair if r["label"] == "interactive + bulk")
        left = s["ceiling_inputs_per_s"] - alone["rate"]
        # What is left of the full-batch rate measured directly (results before it have none).
        left_direct = s["direct_inputs_per_s"] - alone["rate"] if "direct_inputs_per_s" in s else 0
        for r in (alone, mixed):
            rep = r["report"]
            b = r.get("bulk")
            cell = f"{b['inputs_per_s_in_window'] / left:.0%} of {left:,.0f}" if b else "-"
            if b and left_direct > 0:
                cell += (f" ({b['inputs_per_s_in_window'] / left_direct:.0%} of the "
                         f"{left_direct:,.0f} left of the rate measured directly)")
            out.append(f"| {share:.0%} ({r['rate']:,.0f} req/s) | {r['label']} | "
                       f"{fmt_ms(lat(rep, 'p50_ms'))} | {fmt_ms(lat(rep, 'p99_ms'))} | "
                       f"{failures(rep)} | {rate(b['inputs_per_s_in_window']) if b else '-'} | "
                       f"{cell} |")
        if share != shares[0]:
            continue
        p99_a, p99_m = lat(alone["report"], "p99_ms"), lat(mixed["report"], "p99_ms")
        added = (p99_m - p99_a) if p99_a is not None and p99_m is not None else None
        shed = (mixed["report"].get("failures") or {}).get("429", 0)
        got = mixed["bulk"]["inputs_per_s_in_window"] / left
        # A no-bulk run that itself shed requests could not carry the load on this machine:
        # it is no baseline, so the p99 and 429 rows cannot be judged from it.
        alone_shed = sum((alone["report"].get("failures") or {}).values())
        sound = alone_shed == 0
        baseline = "" if sound else f"; the run without bulk failed {alone_shed:,} itself"
        targets.append(("bulk backlog at 50%: interactive p99 within one upstream call of no "
                        "bulk", f"{'-' if added is None else f'{added:+.2f} ms'} (call "
                        f"{s['upstream_call_ms']:.2f} ms{baseline})",
                        (added is not None and added <= s["upstream_call_ms"]) if sound
                        else None))
        targets.append(("bulk backlog at 50%: interactive p99 within 1 ms of no bulk",
                        f"{'-' if added is None else f'{added:+.2f} ms'}{baseline}",
                        (added is not None and added <= 1.0) if sound else None))
        targets.append(("bulk backlog at 50%: 0 interactive 429s", f"{shed:,}{baseline}",
                        True if shed == 0 else (False if sound else None)))
        targets.append(("bulk backlog at 50%: bulk >= 90% of the capacity left", f"{got:.0%}",
                        got >= 0.9))
    if any((r.get("bulk") or {}).get("job_finished_inside_window") for r in runs):
        out += ["", "_A bulk job finished inside its window: its rate is a lower bound._"]
    return out


def render_bulk_faults(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    out = [f"Two workers with their defaults, each on its own "
           f"{s['upstream'].removeprefix('one ').removesuffix(' per worker')}; "
           f"nats-server with JetStream on a store directory kept across its restart. The same "
           f"job twice on the same stack: undisturbed, then with worker B killed (SIGKILL) at 25% "
           f"of its requests and nats-server killed and restarted (1 s down) at 50%.", "",
           "| run | inputs | status | job s | inputs lost | custom_ids duplicated | "
           "failed requests | poll errors |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        j = r["job"]
        counts = j.get("request_counts") or {}
        out.append(f"| {r['label']} | {j['inputs']:,} | {j['status']} | {j['job_s']:.1f} | "
                   f"{j.get('inputs_lost', '-')} | {j.get('duplicated_custom_ids', '-')} | "
                   f"{counts.get('failed', '-')} | {j['poll_errors']} |")
    base, faulted = res["runs"][0]["job"], res["runs"][-1]["job"]
    lost, dup = faulted.get("inputs_lost"), faulted.get("duplicated_custom_ids")
    stuck = faulted.get("not_final_in_time")
    if stuck:
        out += ["", f"**The faulted job did not finish**: {stuck['requests_done']:,} of "
                    f"{faulted['requests']:,} requests were done and it was still "
                    f"`{stuck['status']}` {stuck['after_s']:.0f} s after its creation; the bench "
                    f"then cancelled it, and the table counts what the cancelled batch "
                    f"delivered (its undone lines are in the error file as `batch_cancelled`)."]
    else:
        out += ["", f"Time added: {faulted['job_s'] - base['job_s']:+.1f} s (from worker B's "
                    f"death on, one upstream does the work of two)."]
    targets.append(("bulk faults: the job completes", "no" if stuck else "yes", not stuck))
    targets.append(("bulk faults: inputs lost", f"{lost}", lost == 0 and not stuck))
    targets.append(("bulk faults: custom_ids duplicated", f"{dup}", dup == 0))
    return out


def render_bulk_sdk(res: dict, targets: list) -> list[str]:
    r = res["runs"][0]["result"]
    out = [f"One worker on {res['settings']['upstream']}, the gateway with its defaults. "
           f"`tests/clients/openai_batch.py` (openai {r.get('openai', '?')}): files.create, "
           f"batches.create, batches.retrieve every second until done, files.content; then the "
           f"same inputs through `/v1/embeddings` ({256} per call) and the cosine of each pair.",
           "", "| inputs | job s | inputs/s | custom_ids duplicated | missing | min cosine |",
           "|---:|---:|---:|---:|---:|---:|",
           f"| {r['inputs']:,} | {r['batch_s']:.1f} | {r['inputs_per_s']:,.0f} | "
           f"{r['duplicated']} | {r['missing']} | {r['min_cosine']:.6f} |"]
    targets.append(("bulk via the openai SDK: every vector cosine >= 0.9999 to /v1/embeddings",
                    f"{r['min_cosine']:.6f}", r["min_cosine"] >= 0.9999))
    return out


RENDERERS = {"bulk_alone": render_bulk_alone, "bulk_interactive": render_bulk_interactive,
             "bulk_faults": render_bulk_faults, "bulk_sdk": render_bulk_sdk}
SHOWS = {
    "bulk_alone": "That the bulk lane alone keeps the upstream busy with full batches.",
    "bulk_interactive": "That a bulk backlog takes only the capacity interactive traffic leaves: "
                        "no interactive 429, p99 within one upstream call.",
    "bulk_faults": "That a job survives a worker crash and a nats-server restart with nothing "
                   "lost and nothing duplicated.",
    "bulk_sdk": "The openai SDK's batch workflow end to end on a real model, vector for vector "
                "equal to the interactive path.",
}
