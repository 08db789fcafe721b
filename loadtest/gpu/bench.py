#!/usr/bin/env python3
"""The GPU table: all-MiniLM-L6-v2 served on a GPU by tei_torch_server.py, called directly and
through embatch (gateway -> NATS -> worker -> the same server), for a few client patterns.

Started by loadtest/gpu/run.sh (which unpacks the binaries and the model); standard library only
(nvidia-ml-py's pynvml is used for GPU utilisation when it is importable). Everything runs on one
machine: the load generator, the gateway, nats-server, the worker and the model server.

Steps: start the model server and wait until it is warm; start nats-server (JetStream on, as the
compose file runs it), one worker pointed at the model server (TEI_URL, TOKENIZER; every other
setting at its default), the gateway; check the vectors of both paths against TEI 1.9.3's
reference embeddings (testdata/); then for each pattern run `embatch-loadtest run` (closed loop,
fresh generated sentences, a different seed per run so no input repeats across runs) against the
model server's /embed and the gateway's /embed, sampling the worker's metrics, the model server's
/stats and the GPU's utilisation over the measured window. Writes gpu.json and gpu.md to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def http(method: str, url: str, body: bytes | None = None, timeout: float = 30.0):
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_http(url: str, seconds: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            status, _ = http("GET", url, timeout=2)
            if status == 200:
                return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    return False


def wait_port(port: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def metrics(url: str) -> dict[str, float]:
    """Prometheus text, summed over label sets by metric name."""
    try:
        _, body = http("GET", url, timeout=5)
    except (OSError, urllib.error.URLError):
        return {}
    out: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def tei_stats(base: str) -> dict:
    try:
        _, body = http("GET", f"{base}/stats", timeout=5)
        return json.loads(body)
    except (OSError, ValueError, urllib.error.URLError):
        return {}


class GpuSampler:
    """GPU utilisation (%) every 200 ms through NVML, with timestamps; empty without NVML."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self.handle = None
        self.stop_flag = threading.Event()
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as err:  # no NVML here (CPU dry run)
            log(f"no GPU utilisation sampling: {err}")
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self) -> None:
        if self.handle is not None:
            self.thread.start()

    def loop(self) -> None:
        while not self.stop_flag.is_set():
            try:
                u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
                self.samples.append((time.time(), int(u.gpu), int(u.memory)))
            except Exception:
                pass
            time.sleep(0.2)

    def mean_between(self, t0: float, t1: float):
        xs = [s[1] for s in self.samples if t0 <= s[0] <= t1]
        return round(sum(xs) / len(xs), 1) if xs else None

    def stop(self) -> None:
        self.stop_flag.set()


class Stack:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = args.log_dir
        os.makedirs(self.logs, exist_ok=True)
        self.tei = f"http://127.0.0.1:{args.tei_port}"
        # The model server that batches across requests as TEI's queue does (--batch-tokens).
        self.tei_batching = f"http://127.0.0.1:{args.tei_batching_port}"
        # The model server the worker calls now, whose /stats a run samples.
        self.upstream = self.tei
        self.gateway = f"http://127.0.0.1:{args.gateway_port}"
        self.worker_metrics = f"http://127.0.0.1:{args.worker_metrics_port}/metrics"
        self.tei_line = ""

    def spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        full = dict(os.environ)
        full.update(env or {})
        out = open(os.path.join(self.logs, f"{name}.log"), "ab")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full, cwd=REPO)
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in ["gateway", "worker", "nats", "tei", "tei-batching"]:
            self.stop(name)

    def start_tei(self, name: str = "tei", batch_tokens: int = 0) -> None:
        a = self.args
        port = a.tei_batching_port if batch_tokens else a.tei_port
        cmd = [
            a.python, os.path.join(HERE, "tei_torch_server.py"), "--model-dir", a.model_dir,
            "--device", a.device, "--port", str(port), "--warm-max-batch", str(a.warm_max_batch),
            "--batch-tokens", str(batch_tokens),
        ]
        proc = self.spawn(name, cmd, {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if not wait_http(f"http://127.0.0.1:{port}/health", a.tei_start_timeout, proc):
            raise RuntimeError(f"model server not up (exit {proc.poll()}); see {name}.log")
        with open(os.path.join(self.logs, f"{name}.log"), errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.startswith("listening on")]
        self.tei_line = lines[-1] if lines else ""
        log(f"model server {name}: {self.tei_line}")

    def start_nats(self) -> None:
        a = self.args
        store = os.path.join(a.work_dir, "nats-store")
        shutil.rmtree(store, ignore_errors=True)
        conf = os.path.join(a.work_dir, "nats.conf")
        # nats/nats.conf's settings (max_payload, max_pending, write_deadline, JetStream limits),
        # with the store under the work directory and no monitoring port.
        with open(conf, "w") as f:
            f.write(
                f'listen: 127.0.0.1:{a.nats_port}\nmax_payload: 8MB\nmax_pending: 256MB\nwrite_deadline: "10s"\n'
                f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, max_file_store: 10GB }}\n'
            )
        self.spawn("nats", [os.path.join(a.bin_dir, "nats-server"), "-c", conf])
        if not wait_port(a.nats_port, 20):
            raise RuntimeError("nats-server not up; see nats.log")

    def worker_env(self, extra: dict | None = None) -> dict:
        a = self.args
        env = {
            "NATS_URL": f"nats://127.0.0.1:{a.nats_port}",
            "TEI_URL": self.upstream,
            "TOKENIZER": os.path.join(a.model_dir, "tokenizer.json"),
            "METRICS_ADDR": f"127.0.0.1:{a.worker_metrics_port}",
            "HF_HUB_OFFLINE": "1",
            "RUST_LOG": "info",
        }
        env.update(extra or {})
        return env

    def start_worker(self, extra: dict | None = None) -> None:
        a = self.args
        with open(os.path.join(self.logs, "worker.log"), "ab") as f:
            f.write(f"\n=== worker start, settings beyond TEI_URL/TOKENIZER: {extra or 'defaults'}\n".encode())
        proc = self.spawn("worker", [os.path.join(a.bin_dir, "embatch-worker")], self.worker_env(extra))
        if not wait_http(f"http://127.0.0.1:{a.worker_metrics_port}/health", 60, proc):
            raise RuntimeError(f"worker not healthy (exit {proc.poll()}); see worker.log")

    def start_gateway(self) -> None:
        a = self.args
        env = {
            "NATS_URL": f"nats://127.0.0.1:{a.nats_port}",
            "LISTEN_ADDR": f"127.0.0.1:{a.gateway_port}",
            "RUST_LOG": "info",
        }
        proc = self.spawn("gateway", [os.path.join(a.bin_dir, "embatch-gateway")], env)
        if not wait_http(f"{self.gateway}/health", 60, proc):
            raise RuntimeError(f"gateway not healthy (exit {proc.poll()}); see gateway.log")


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb)


def check_vectors(stack: Stack) -> dict:
    """Every reference case of testdata/minilm-reference-embeddings.json (TEI 1.9.3, CPU, fp32)
    through both paths: cosine to the reference, and between the two paths. The cases go out all
    at once on each path, so a batching server and the worker put several into one forward pass."""
    with open(os.path.join(REPO, "testdata", "minilm-reference-embeddings.json")) as f:
        ref = json.load(f)
    out = {"reference": ref["produced_by"], "upstream": stack.upstream, "cases": []}
    worst = {"direct": 1.0, "embatch": 1.0, "direct_vs_embatch": 1.0}
    bodies = [json.dumps(case["request"]).encode() for case in ref["cases"]]
    got: dict[str, list] = {}
    for path, url in [("direct", f"{stack.upstream}/embed"), ("embatch", f"{stack.gateway}/embed")]:
        replies: list = [None] * len(bodies)

        def send(i: int, url: str = url, replies: list = replies) -> None:
            replies[i] = http("POST", url, bodies[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for status, reply in replies:
            if status != 200:
                raise RuntimeError(f"{path} answered {status} to a reference case: {reply[:300]!r}")
        got[path] = [json.loads(reply) for _, reply in replies]
    for i, case in enumerate(ref["cases"]):
        direct, embatch = got["direct"][i], got["embatch"][i]
        cos_d = [cosine(a, b) for a, b in zip(direct, case["embeddings"])]
        cos_e = [cosine(a, b) for a, b in zip(embatch, case["embeddings"])]
        cos_de = [cosine(a, b) for a, b in zip(direct, embatch)]
        norm_e = [math.sqrt(sum(x * x for x in v)) for v in embatch]
        norm_r = [math.sqrt(sum(x * x for x in v)) for v in case["embeddings"]]
        if len(direct) != len(case["embeddings"]) or len(embatch) != len(case["embeddings"]):
            raise RuntimeError(f"case {i}: {len(direct)} / {len(embatch)} vectors for {len(case['embeddings'])} inputs")
        out["cases"].append(
            {
                "inputs": len(case["embeddings"]),
                "options": {k: v for k, v in case["request"].items() if k != "inputs"},
                "min_cosine_direct_vs_reference": min(cos_d),
                "min_cosine_embatch_vs_reference": min(cos_e),
                "min_cosine_direct_vs_embatch": min(cos_de),
                "max_norm_ratio_embatch_vs_reference": max(abs(a / b - 1) for a, b in zip(norm_e, norm_r)),
            }
        )
        worst["direct"] = min(worst["direct"], min(cos_d))
        worst["embatch"] = min(worst["embatch"], min(cos_e))
        worst["direct_vs_embatch"] = min(worst["direct_vs_embatch"], min(cos_de))
    out["min_cosine"] = worst
    out["passed"] = worst["direct"] >= 0.999 and worst["embatch"] >= 0.999
    if not out["passed"]:
        raise RuntimeError(f"vectors differ from the reference: {worst}")
    return out


PATTERNS = [
    # name, concurrency, inputs per request
    ("single c=64", 64, 1),
    ("single c=256", 256, 1),
    ("32-input c=8", 8, 32),
    # an indexing client: full 512-input requests, as a document pipeline sends them
    ("512-input c=4", 4, 512),
]


def wait_drained(stack: Stack, limit: float = 90.0) -> float:
    """Waits until the model server has finished what the last run left queued (a client that
    timed out leaves its request there): no call for 1 s and /health answering. Seconds waited."""
    t0 = time.time()
    last = tei_stats(stack.upstream).get("calls")
    quiet_since = time.time()
    while time.time() - t0 < limit:
        time.sleep(0.25)
        calls = tei_stats(stack.upstream).get("calls")
        if calls != last:
            last, quiet_since = calls, time.time()
        elif time.time() - quiet_since >= 1.0:
            break
    return round(time.time() - t0, 2)


def run_load(stack: Stack, sampler: GpuSampler, name: str, url: str, c: int, k: int, seed: int, path: str) -> dict:
    a = stack.args
    json_path = os.path.join(a.work_dir, "runs", f"{name}.json")
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    cmd = [
        os.path.join(a.bin_dir, "embatch-loadtest"), "run", "--url", url,
        "--concurrency", str(c), "--inputs-per-request", str(k),
        "--duration", f"{a.duration}s", "--warmup", f"{a.warmup}s", "--timeout", f"{a.timeout}s",
        "--seed", str(seed), "--json", json_path, "--quiet",
    ]
    snaps = {}

    def snapshot(key: str) -> None:
        snaps[key] = {"t": time.time(), "tei": tei_stats(stack.upstream), "worker": metrics(stack.worker_metrics)}

    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
    timer = threading.Timer(a.warmup, snapshot, args=("begin",))
    timer.start()
    output, _ = proc.communicate(timeout=a.warmup + a.duration + a.timeout + 60)
    snapshot("end")
    timer.join()
    text = output.decode(errors="replace")
    with open(os.path.join(stack.logs, "loadtest.log"), "a") as f:
        f.write(f"=== {name}: {' '.join(cmd)}\n{text}\n")
    if proc.returncode != 0:
        raise RuntimeError(f"loadtest {name} exited {proc.returncode}: {text[-2000:]}")
    with open(json_path) as f:
        report = json.load(f)
    b, e = snaps.get("begin", snaps["end"]), snaps["end"]
    wall = e["t"] - b["t"]
    tei_calls = e["tei"].get("calls", 0) - b["tei"].get("calls", 0)
    tei_inputs = e["tei"].get("inputs", 0) - b["tei"].get("inputs", 0)
    tei_busy = e["tei"].get("busy_s", 0.0) - b["tei"].get("busy_s", 0.0)
    tei_held = e["tei"].get("held_s", 0.0) - b["tei"].get("held_s", 0.0)
    derived = {
        "upstream_calls_per_s": tei_calls / wall if wall > 0 else None,
        "upstream_inputs_per_call": tei_inputs / tei_calls if tei_calls else None,
        "upstream_forward_ms_per_call": 1000 * tei_busy / tei_calls if tei_calls else None,
        "upstream_busy_share": tei_busy / wall if wall > 0 else None,
        "upstream_held_ms_per_call": 1000 * tei_held / tei_calls if tei_calls else None,
        "upstream_held_share": tei_held / wall if wall > 0 else None,
        "gpu_util_mean_pct": sampler.mean_between(b["t"], e["t"]),
        "sample_window_s": wall,
    }
    if path == "embatch":
        w0, w1 = b["worker"], e["worker"]

        def d(key: str) -> float:
            return w1.get(key, 0.0) - w0.get(key, 0.0)

        n = d("embatch_worker_batch_inputs_count")
        derived["worker_mean_batch_inputs"] = d("embatch_worker_batch_inputs_sum") / n if n else None
        u = d("embatch_worker_upstream_seconds_count")
        derived["worker_upstream_call_ms"] = 1000 * d("embatch_worker_upstream_seconds_sum") / u if u else None
        q = d("embatch_worker_queue_wait_seconds_count")
        derived["worker_queue_wait_ms"] = 1000 * d("embatch_worker_queue_wait_seconds_sum") / q if q else None
    derived["drain_s"] = wait_drained(stack)
    lat = report.get("latency") or {}
    tp = report["goodput"]
    log(
        f"{name}: {tp['inputs_per_s']:.0f} inputs/s, {tp['requests_per_s']:.0f} req/s, "
        f"p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms, failures {report['failures'] or 0}, "
        f"upstream {derived['upstream_inputs_per_call'] and round(derived['upstream_inputs_per_call'], 1)} inputs/call, "
        f"GPU util {derived['gpu_util_mean_pct']}%, drained in {derived['drain_s']} s ({time.time() - started:.0f} s)"
    )
    return {"name": name, "path": path, "concurrency": c, "inputs_per_request": k, "seed": seed,
            "command": " ".join(cmd), "report": report, "derived": derived}


def machine_info(stack: Stack) -> dict:
    info = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "model_server": stack.tei_line,
        "python": sys.version.split()[0],
    }
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
        info["gpu"] = q.stdout.strip() or q.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        info["gpu"] = f"none ({err})"
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu_model"] = names[0] if names else None
    except OSError:
        pass
    return info


def fmt(x, digits=3):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def render(result: dict) -> str:
    lines = [
        "| pattern | path | inputs/s | req/s | p50 ms | p99 ms | errors | inputs per upstream call | GPU util % |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in result["runs"]:
        rep, d = r["report"], r["derived"]
        lat = rep.get("latency") or {}
        errors = ", ".join(f"{k}: {v:,}" for k, v in rep["failures"].items()) or "0"
        lines.append(
            f"| {r['pattern']} | {r['path_label']} | {fmt(rep['goodput']['inputs_per_s'])} | "
            f"{fmt(rep['goodput']['requests_per_s'])} | {fmt(lat.get('p50_ms'))} | {fmt(lat.get('p99_ms'))} | "
            f"{errors} | {fmt(d.get('upstream_inputs_per_call'))} | {fmt(d.get('gpu_util_mean_pct'))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work-dir", default="/tmp/embatch-gpu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--duration", type=float, default=15)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--timeout", type=float, default=10, help="client timeout per request, s")
    p.add_argument("--warm-max-batch", type=int, default=512)
    p.add_argument("--tei-start-timeout", type=float, default=240)
    p.add_argument("--patterns", default="all", help="comma-separated indexes into PATTERNS, or all")
    p.add_argument("--tuned-batch", type=int, default=256,
                   help="also run --tuned-patterns through a worker with MAX_BATCH_SIZE=N (0: skip)")
    p.add_argument("--tuned-patterns", default="1,2",
                   help="comma-separated indexes into PATTERNS run again with the tuned settings (default: single c=256 and 32-input c=8)")
    p.add_argument("--tuned-calls", type=int, default=4,
                   help="and again with MAX_CONCURRENT_BATCHES=N besides (0: skip)")
    p.add_argument("--batch-tokens", type=int, default=16384,
                   help="then run every pattern again against a model server that batches across requests "
                        "up to N tokens per forward pass, as TEI's queue (0: skip)")
    p.add_argument("--tei-port", type=int, default=18090)
    p.add_argument("--tei-batching-port", type=int, default=18091)
    p.add_argument("--nats-port", type=int, default=14222)
    p.add_argument("--gateway-port", type=int, default=18080)
    p.add_argument("--worker-metrics-port", type=int, default=19091)
    args = p.parse_args()
    args.model_dir = os.path.abspath(args.model_dir)
    args.bin_dir = os.path.abspath(args.bin_dir)
    args.log_dir = os.path.join(args.work_dir, "logs")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.log_dir)
    os.makedirs(args.out, exist_ok=True)

    t_start = time.time()
    stack = Stack(args)
    sampler = GpuSampler()
    result: dict = {
        "what": "all-MiniLM-L6-v2 on tei_torch_server.py (fp16 on CUDA; not TEI): one forward per request, "
                "then batching across requests as TEI's queue does; each called directly and through embatch",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_commit": open(os.path.join(args.bin_dir, "BUILD_COMMIT")).read().strip()
        if os.path.exists(os.path.join(args.bin_dir, "BUILD_COMMIT")) else None,
        "settings": {k: v for k, v in vars(args).items() if k not in ("log_dir",)},
        "runs": [],
    }
    try:
        log("starting the model server")
        stack.start_tei()
        log("starting nats-server, the worker and the gateway")
        stack.start_nats()
        stack.start_worker()
        stack.start_gateway()
        _, info = http("GET", f"{stack.gateway}/info")
        result["gateway_info"] = json.loads(info)
        result["machine"] = machine_info(stack)
        log(f"machine: {result['machine']}")
        result["check"] = check_vectors(stack)
        log(f"vectors vs TEI 1.9.3 reference, min cosine: {result['check']['min_cosine']}")
        sampler.start()
        chosen = PATTERNS if args.patterns == "all" else [PATTERNS[int(i)] for i in args.patterns.split(",")]
        seed = 1000
        # (model server, label of its direct rows, label of embatch's rows in front of it)
        servers = [("tei", "direct", "embatch (gateway)")]
        if args.batch_tokens:
            servers.append(("tei-batching", "direct, server batches (TEI-like)", "embatch → batching server"))
        for server, direct_label, embatch_label in servers:
            if server != "tei":
                log(f"starting the batching model server (--batch-tokens {args.batch_tokens}); worker -> it")
                stack.stop("tei")
                stack.start_tei(server, args.batch_tokens)
                stack.upstream = stack.tei_batching
                stack.stop("worker")
                stack.start_worker()
                wait_http(f"{stack.gateway}/health", 30)
                result["check_batching"] = check_vectors(stack)
                log(f"batching server, vectors vs reference, min cosine: {result['check_batching']['min_cosine']}")
            for pattern, c, k in chosen:
                for path, url, label in [
                    ("direct", f"{stack.upstream}/embed", direct_label),
                    ("embatch", f"{stack.gateway}/embed", embatch_label),
                ]:
                    seed += 1
                    name = f"{pattern} {path} {server}".replace(" ", "_").replace("=", "")
                    r = run_load(stack, sampler, name, url, c, k, seed, path)
                    r.update({"pattern": pattern, "path_label": label, "worker_settings": "defaults",
                              "server": server})
                    result["runs"].append(r)
        tuned = []
        if args.tuned_batch:
            tuned.append({"MAX_BATCH_SIZE": str(args.tuned_batch)})
            if args.tuned_calls:
                tuned.append({"MAX_BATCH_SIZE": str(args.tuned_batch), "MAX_CONCURRENT_BATCHES": str(args.tuned_calls)})
        for settings in tuned:
            shown = ", ".join(f"{k}={v}" for k, v in settings.items())
            log(f"restarting the worker with {shown}")
            stack.stop("worker")
            stack.start_worker(settings)
            wait_http(f"{stack.gateway}/health", 30)
            server = "tei-batching" if args.batch_tokens else "tei"
            for pattern, c, k in [PATTERNS[int(i)] for i in args.tuned_patterns.split(",")]:
                seed += 1
                name = f"{pattern} embatch {shown} {server}".replace(" ", "_").replace("=", "").replace(",", "")
                r = run_load(stack, sampler, name, f"{stack.gateway}/embed", c, k, seed, "embatch")
                label = "embatch → batching server" if args.batch_tokens else "embatch"
                r.update({"pattern": pattern, "path_label": f"{label}, {shown}",
                          "worker_settings": settings, "server": server})
                result["runs"].append(r)
        result["complete"] = True
    except Exception as err:  # keep what was measured
        result["complete"] = False
        result["error"] = f"{type(err).__name__}: {err}"
        log(f"FAILED: {result['error']}")
    finally:
        sampler.stop()
        stack.stop_all()
        result["wall_s"] = round(time.time() - t_start, 1)
        with open(os.path.join(args.out, "gpu.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, "gpu.md"), "w") as f:
            f.write(render(result))
        subprocess.run(["tar", "-czf", os.path.join(args.out, "logs.tar.gz"), "-C", args.work_dir, "logs", "runs"],
                       check=False)
        log(f"wrote {args.out}/gpu.json, gpu.md, logs.tar.gz ({result['wall_s']} s)")
    print(render(result))
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
