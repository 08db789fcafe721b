#!/usr/bin/env python3
"""embatch benchmarks: one command that builds, starts, measures and stops everything itself.

    python3 loadtest/bench.py              # the full matrix (about 10-12 minutes)
    python3 loadtest/bench.py --quick      # short runs, for development (results in results/quick/)
    python3 loadtest/bench.py --only overload [--only tuning ...]

It builds the release binaries (`cargo build --release --locked -p embatch-gateway -p embatch-worker
-p embatch-loadtest`), finds nats-server (`scripts/install-nats-server.sh`) and, for the scenarios
that need it, the built-in model (`scripts/fetch-model.sh`), then for each scenario starts its own
stack on free 127.0.0.1 ports (nats-server, fake upstreams, workers, the gateway), drives it with
`embatch-loadtest run`, and stops every process it started (by PID, also on Ctrl-C or an error).

Output: one raw JSON file per scenario, `loadtest/results/<scenario>.json` (the settings, every
loadtest report as `embatch-loadtest run --json` wrote it, and derived numbers), and
`loadtest/results/RESULTS.md`, rendered from all scenario files present, so `--only X` refreshes
one section and keeps the others. Logs of every process go to a temporary directory (printed).

Python 3 standard library only. Linux only (CPU time is read from /proc/PID/stat).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "loadtest" / "results"
SUBJECT = "embed"  # embatch_protocol::DEFAULT_SUBJECT

# The GPU-like upstream of the issue: 5 ms + 20 us per input, one call at a time.
GPU_BASE_MS, GPU_PER_INPUT_US = 5, 20
BATCH = 32
MAX_WAIT_MS = 5
DIRECT_CAPACITY = 1.0 / (GPU_BASE_MS / 1e3 + GPU_PER_INPUT_US / 1e6)  # ~199 req/s
CEILING = BATCH / (GPU_BASE_MS / 1e3 + BATCH * GPU_PER_INPUT_US / 1e6)  # ~5,674 req/s
# Scaling: a slow upstream (~300 req/s per worker at batch 32) so the machine is not the limit.
SLOW_BASE_MS, SLOW_PER_INPUT_US = 100, 200

# Worker defaults, stated explicitly so every result records them.
WORKER_DEFAULTS = {
    "MAX_BATCH_SIZE": str(BATCH),
    "MAX_WAIT_TIME": f"{MAX_WAIT_MS}ms",
    "MAX_CONCURRENT_BATCHES": "2",
    "QUEUE_CAP": "4096",
    "SHUTDOWN_GRACE": "2s",
}

SCENARIOS = [
    ("gpu_rates", "1. GPU-like upstream: open loop at rising rates"),
    ("low_load", "2. Low load: the latency embatch adds"),
    ("cpu_model", "3. Built-in CPU model through the gateway"),
    ("pipeline", "4. Instant upstream: the pipeline's own ceiling and CPU cost"),
    ("scaling", "5. Scaling out: 1, 2 and 4 workers"),
    ("tuning", "6. MAX_WAIT_TIME x MAX_BATCH_SIZE at a fixed load"),
    ("overload", "7. Overload at 2x capacity: the throughput paradox"),
]
SCENARIO_NAMES = [name for name, _ in SCENARIOS]

# Environment variables of embatch and its HTTP clients that must not leak into the stack.
SCRUBBED_ENV = {
    "NATS_URL", "EMBATCH_SUBJECT", "EMBATCH_QUEUE_GROUP", "TEI_URL", "MODEL_DIR",
    "MAX_BATCH_SIZE", "MAX_WAIT_TIME", "MAX_CONCURRENT_BATCHES", "QUEUE_CAP",
    "MAX_CLIENT_BATCH_SIZE", "DEFAULT_DEADLINE", "UPSTREAM_TIMEOUT", "SHUTDOWN_GRACE",
    "METRICS_ADDR", "LOG_FORMAT", "LISTEN_ADDR", "REQUEST_TIMEOUT", "MAX_BODY_BYTES",
    "HEALTH_TIMEOUT", "RUST_LOG", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
    "all_proxy", "ALL_PROXY",
}

CLK_TCK = os.sysconf("SC_CLK_TCK")
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class BenchError(Exception):
    """A scenario could not run (a process died, a port never opened, a run failed)."""


class Terminated(Exception):
    """SIGTERM or SIGHUP: stop like on Ctrl-C."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["RUST_LOG"] = "warn"
    env.update(extra or {})
    return env


def free_port(taken: set[int]) -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise BenchError("no free loopback port")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with NO_PROXY_OPENER.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def load_average() -> float:
    return os.getloadavg()[0]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a running process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------------------
# Processes


class Child:
    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path, log_file):
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.log_file = log_file

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise BenchError(
                f"{self.name} (pid {self.pid}) exited with {self.popen.returncode}:\n"
                f"{self.log_tail()}"
            )


class Supervisor:
    """Starts processes in their own session and stops exactly those, by PID."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.children: list[Child] = []
        self.seq = 0

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        self.seq += 1
        safe = "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in name)
        log_path = self.log_dir / f"{self.seq:03d}-{safe}.log"
        log_file = open(log_path, "wb")
        log_file.write(("$ " + shlex.join(argv) + "\n").encode())
        log_file.flush()
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # Own session: a Ctrl-C in the terminal reaches only this script, which then stops
            # its children in order.
            start_new_session=True,
        )
        child = Child(name, popen, log_path, log_file)
        self.children.append(child)
        return child

    def stop(self, child: Child, grace: float = 6.0) -> None:
        if child.popen.poll() is None:
            # Popen.send_signal signals only while the child is not yet reaped: never a reused PID.
            child.popen.send_signal(signal.SIGTERM)
            try:
                child.popen.wait(grace)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                try:
                    child.popen.wait(5)
                except subprocess.TimeoutExpired:
                    log(f"warning: {child.name} (pid {child.pid}) did not die")
        child.log_file.close()
        if child in self.children:
            self.children.remove(child)

    def mark(self) -> int:
        return len(self.children)

    def stop_since(self, mark: int) -> None:
        for child in reversed(self.children[mark:]):
            self.stop(child)

    def stop_all(self) -> None:
        self.stop_since(0)


def wait_until(what: str, check, timeout: float, children: list[Child] = ()) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for c in children:
            c.check_alive()
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------------------------
# The stack


class Target:
    def __init__(self, path: str, args: list[str]):
        self.path = path  # "direct", "gateway" or "nats"
        self.args = args


class Nats:
    def __init__(self, child: Child, port: int, monitor_port: int):
        self.child = child
        self.port = port
        self.monitor_port = monitor_port
        self.url = f"nats://127.0.0.1:{port}"

    def subscribers(self) -> int:
        status, body = http_get(
            f"http://127.0.0.1:{self.monitor_port}/subsz?subs=1&limit=100000"
        )
        if status != 200:
            return -1
        subs = json.loads(body).get("subscriptions_list") or []
        return sum(1 for s in subs if s.get("subject") == SUBJECT)

    def target(self) -> Target:
        return Target("nats", ["--nats", self.url, "--subject", SUBJECT])


class Worker:
    def __init__(self, child: Child, metrics_port: int, settings: dict[str, str]):
        self.child = child
        self.metrics_port = metrics_port
        self.settings = settings

    def totals(self) -> dict[str, float]:
        """Sums and counts of the worker's batch-size and upstream-time histograms so far."""
        status, body = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        if status != 200:
            raise BenchError(f"worker /metrics answered {status}")
        wanted = ("embatch_worker_batch_inputs_sum", "embatch_worker_batch_inputs_count",
                  "embatch_worker_upstream_seconds_sum", "embatch_worker_upstream_seconds_count",
                  "embatch_worker_queue_wait_seconds_sum",
                  "embatch_worker_queue_wait_seconds_count")
        totals = dict.fromkeys(wanted, 0.0)
        for line in body.decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in totals:
                totals[parts[0]] = float(parts[1])
        return totals


def batch_stats(before: list[dict], after: list[dict], measured_s: float) -> dict:
    """Mean inputs per upstream call, calls per second and mean call time over a window."""
    delta = {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in after[0]}
    calls = delta["embatch_worker_batch_inputs_count"]
    timed = delta["embatch_worker_upstream_seconds_count"]
    waited = delta["embatch_worker_queue_wait_seconds_count"]
    return {
        "mean_queue_wait_ms": (1e3 * delta["embatch_worker_queue_wait_seconds_sum"] / waited
                               if waited else None),
        "mean_batch_inputs": delta["embatch_worker_batch_inputs_sum"] / calls if calls else None,
        "upstream_calls_per_s": calls / measured_s if measured_s > 0 else None,
        "mean_upstream_call_ms": (1e3 * delta["embatch_worker_upstream_seconds_sum"] / timed
                                  if timed else None),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, bins: dict[str, str], nats_bin: str,
                 log_dir: Path, out_dir: Path):
        self.quick = args.quick
        self.bins = bins
        self.nats_bin = nats_bin
        self.sup = Supervisor(log_dir)
        self.log_dir = log_dir
        self.out_dir = out_dir
        self.ports: set[int] = set()
        self.runs = 0
        self._model_dir: str | None = None

    # durations: (full, quick) seconds
    def d(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    def model_dir(self) -> str:
        if self._model_dir is None:
            log("fetching the built-in model (scripts/fetch-model.sh)")
            out = subprocess.run(
                [str(REPO / "scripts" / "fetch-model.sh")], cwd=REPO, check=True,
                stdout=subprocess.PIPE, text=True,
            )
            self._model_dir = out.stdout.strip().splitlines()[-1]
        return self._model_dir

    def nats(self) -> Nats:
        port, mon = free_port(self.ports), free_port(self.ports)
        child = self.sup.spawn(
            "nats-server",
            [self.nats_bin, "-a", "127.0.0.1", "-p", str(port), "-m", str(mon)],
            child_env(),
        )
        nats = Nats(child, port, mon)
        wait_until("nats-server", lambda: port_open(port) and nats.subscribers() >= 0, 15,
                   [child])
        return nats

    def fake_upstream(self, base_ms: float, per_input_us: float, concurrency: int,
                      name: str = "fake-upstream") -> tuple[Child, str]:
        child = self.sup.spawn(
            name,
            [self.bins["embatch-loadtest"], "fake-upstream", "--listen", "127.0.0.1:0",
             "--base-ms", str(base_ms), "--per-input-us", str(per_input_us),
             "--concurrency", str(concurrency)],
            child_env(),
        )
        addr: list[str] = []

        def listening() -> bool:
            for line in child.log_path.read_text(errors="replace").splitlines():
                if line.startswith("listening on "):
                    addr.append(line.split()[-1])
                    return True
            return False

        wait_until(f"{name} to listen", listening, 15, [child])
        url = f"http://{addr[0]}"
        wait_until(f"{name} /health", lambda: http_get(url + "/health")[0] == 200, 10, [child])
        return child, url

    def worker(self, nats: Nats, *, tei_url: str | None = None, model: bool = False,
               name: str = "worker", **settings: str) -> Worker:
        metrics_port = free_port(self.ports)
        env = dict(WORKER_DEFAULTS)
        env.update(settings)
        env["NATS_URL"] = nats.url
        env["METRICS_ADDR"] = f"127.0.0.1:{metrics_port}"
        if tei_url is not None:
            env["TEI_URL"] = tei_url
        elif model:
            env["MODEL_DIR"] = self.model_dir()
        else:
            raise BenchError("a worker needs tei_url or model")
        child = self.sup.spawn(name, [self.bins["embatch-worker"]], child_env(env))
        recorded = {k: v for k, v in env.items() if k not in ("NATS_URL", "METRICS_ADDR")}
        return Worker(child, metrics_port, recorded)

    def wait_workers(self, nats: Nats, workers: list[Worker], timeout: float = 30) -> None:
        """Until exactly `len(workers)` subscriptions on the subject exist and /metrics answers."""
        children = [w.child for w in workers]
        wait_until(f"{len(workers)} worker(s) to subscribe",
                   lambda: nats.subscribers() == len(workers), timeout, children)
        for w in workers:
            wait_until("worker /metrics", lambda w=w: port_open(w.metrics_port), 10, children)

    def stop_worker(self, nats: Nats, worker: Worker, remaining: int) -> None:
        self.sup.stop(worker.child)
        wait_until("the worker to unsubscribe", lambda: nats.subscribers() == remaining, 10)

    def gateway(self, nats: Nats, request_timeout: str = "2s") -> tuple[Child, Target]:
        port = free_port(self.ports)
        env = {"NATS_URL": nats.url, "LISTEN_ADDR": f"127.0.0.1:{port}",
               "REQUEST_TIMEOUT": request_timeout}
        child = self.sup.spawn("gateway", [self.bins["embatch-gateway"]], child_env(env))
        wait_until("the gateway to listen", lambda: port_open(port), 15, [child])
        return child, Target("gateway", ["--url", f"http://127.0.0.1:{port}/embed"])

    def load(self, label: str, target: Target, *, rate: float | None = None,
             concurrency: int | None = None, duration: float, warmup: float,
             timeout: float = 2.0, corpus: str | None = None, workers: list[Worker] = (),
             measure_cpu_of: dict[str, Child] | None = None) -> dict:
        """Runs `embatch-loadtest run` and returns its JSON report, plus `batches` (from the
        workers' metrics over the measured window) and `cpu_s` (per process) when asked."""
        self.runs += 1
        json_path = self.log_dir / f"run-{self.runs:03d}.json"
        argv = [self.bins["embatch-loadtest"], "run", *target.args]
        if rate is not None:
            argv += ["--rate", f"{rate:.1f}"]
        else:
            argv += ["--concurrency", str(concurrency)]
        argv += ["--duration", f"{duration:g}s", "--warmup", f"{warmup:g}s",
                 "--timeout", f"{timeout:g}s", "--json", str(json_path), "--quiet"]
        if corpus:
            argv += ["--corpus", corpus]
        cpu_before = {n: c.cpu() for n, c in (measure_cpu_of or {}).items()}
        children_before = children_cpu_seconds()
        started = time.monotonic()
        child = self.sup.spawn(f"loadtest-{label}", argv, child_env())
        try:
            if workers:
                # The workers' counters over the measured window only: from the end of the
                # warm-up to the planned end, not the drain after it.
                time.sleep(max(0.0, started + warmup - time.monotonic()))
                before = [w.totals() for w in workers]
                time.sleep(max(0.0, started + warmup + duration - time.monotonic()))
                window = [w.totals() for w in workers]
            limit = warmup + duration + timeout + 60
            try:
                child.popen.wait(max(1.0, started + limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(f"loadtest {label} did not finish within {limit:.0f} s")
        finally:
            cpu_after = {n: c.cpu() for n, c in (measure_cpu_of or {}).items() if c.alive()}
            self.sup.stop(child)
        wall = time.monotonic() - started
        if child.popen.returncode != 0:
            raise BenchError(f"loadtest {label} failed:\n{child.log_tail()}")
        report = json.loads(json_path.read_text())
        if workers:
            report["batches"] = batch_stats(before, window, duration)
        if measure_cpu_of is not None:
            report["cpu_s"] = {n: cpu_after[n] - cpu_before[n] for n in cpu_after}
            report["cpu_s"]["loadtest"] = children_cpu_seconds() - children_before
            report["cpu_wall_s"] = wall
        log(f"  {label:<30} {summary_line(report)}")
        time.sleep(self.d(0.5, 0.2))  # let in-flight work drain between runs
        return report


# --------------------------------------------------------------------------------------------
# Report helpers


def goodput(r: dict) -> float:
    return r["goodput"]["requests_per_s"]


def throughput(r: dict) -> float:
    return r["throughput"]["requests_per_s"]


def lat(r: dict, key: str) -> float | None:
    return (r.get("latency") or {}).get(key)


def kind_latency(r: dict, kind: str, key: str) -> float | None:
    return ((r.get("error_latency_by_kind") or {}).get(kind) or {}).get(key)


def failures(r: dict) -> str:
    f = r.get("failures") or {}
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(f.items())) or "0"


def summary_line(r: dict) -> str:
    line = (f"goodput {goodput(r):8,.1f} req/s  p50 {fmt_ms(lat(r, 'p50_ms')):>6} ms  "
            f"p99 {fmt_ms(lat(r, 'p99_ms')):>6} ms  failures {failures(r)}")
    b = r.get("batches")
    if b and b["mean_batch_inputs"] is not None:
        line += (f"  [batch {b['mean_batch_inputs']:.1f}, {b['upstream_calls_per_s']:.0f} calls/s,"
                 f" {b['mean_upstream_call_ms']:.2f} ms/call]")
    return line


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 10:
        return f"{x:.2f}"
    if x < 100:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


# --------------------------------------------------------------------------------------------
# Scenarios: each starts its own stack and returns its result (saved as <name>.json).


def run_entry(label: str, params: dict, report: dict) -> dict:
    return {"label": label, **params, "report": report}


def scenario_gpu_rates(b: Bench) -> dict:
    rates = [100, 400, 2000, 5400] if b.quick else [100, 200, 400, 1000, 2500, 4000, 5000,
                                                     5400, 5550]
    direct_max_rate = 400  # beyond this the direct path only times out
    warmup, duration = b.d(2, 1), b.d(8, 3)
    nats = b.nats()
    _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
    w = b.worker(nats, tei_url=up)
    b.wait_workers(nats, [w])
    _, gw = b.gateway(nats)
    direct = Target("direct", ["--url", up + "/embed"])
    runs = []
    for rate in rates:
        for target in (direct, gw, nats.target()):
            if target.path == "direct" and rate > direct_max_rate:
                continue
            r = b.load(f"{target.path} @ {rate} req/s", target, rate=rate, warmup=warmup,
                       duration=duration, workers=[w] if target.path != "direct" else ())
            runs.append(run_entry(target.path, {"path": target.path, "rate": rate}, r))
    return {"settings": {"upstream": f"fake-upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} us/input,"
                                     " concurrency 1", "worker": w.settings,
                         "gateway": {"REQUEST_TIMEOUT": "2s"}, "timeout_s": 2,
                         "warmup_s": warmup, "duration_s": duration,
                         "direct_capacity": DIRECT_CAPACITY, "ceiling": CEILING},
            "runs": runs}


def scenario_low_load(b: Bench) -> dict:
    # ~20 req/s, but not exactly: at 20 req/s every request would be due at the same phase of
    # the 1 ms timer ticks of the load generator and of the worker (tokio's timer resolution),
    # and that phase, different in every run, would shift every latency of a run by the same
    # 0-1 ms. At 19.93 req/s the phase sweeps, so each run sees the average.
    rate, warmup, duration = 19.93, 1, b.d(15, 5)
    nats = b.nats()
    _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
    w = b.worker(nats, tei_url=up)
    b.wait_workers(nats, [w])
    _, gw = b.gateway(nats)
    runs = []
    for target in (Target("direct", ["--url", up + "/embed"]), gw, nats.target()):
        r = b.load(f"{target.path} @ {rate} req/s", target, rate=rate, warmup=warmup,
                   duration=duration, workers=[w] if target.path != "direct" else ())
        runs.append(run_entry(target.path, {"path": target.path, "rate": rate}, r))
    return {"settings": {"upstream": f"fake-upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} us/input,"
                                     " concurrency 1", "worker": w.settings, "rate": rate,
                         "warmup_s": warmup, "duration_s": duration,
                         "max_wait_ms": MAX_WAIT_MS},
            "runs": runs}


def corpus_path() -> str | None:
    p = REPO / "testdata" / "reference-inputs.txt"
    return str(p) if p.is_file() else None


def cpu_model_stack(b: Bench, request_timeout: str) -> tuple[Nats, Worker, Target]:
    nats = b.nats()
    w = b.worker(nats, model=True)
    b.wait_workers(nats, [w], timeout=180)
    _, gw = b.gateway(nats, request_timeout=request_timeout)
    return nats, w, gw


def scenario_cpu_model(b: Bench) -> dict:
    warmup, duration = b.d(3, 2), b.d(10, 3)
    corpus = corpus_path()
    _, w, gw = cpu_model_stack(b, "10s")
    runs = []
    for c in (1, 16, 64):
        r = b.load(f"gateway c={c}", gw, concurrency=c, warmup=warmup, duration=duration,
                   timeout=10, corpus=corpus, workers=[w])
        runs.append(run_entry("gateway", {"path": "gateway", "concurrency": c}, r))
    return {"settings": {"upstream": "built-in CPU model (MODEL_DIR)", "worker": w.settings,
                         "gateway": {"REQUEST_TIMEOUT": "10s"}, "timeout_s": 10,
                         "corpus": corpus or "generated sentences of 12 words",
                         "warmup_s": warmup, "duration_s": duration},
            "runs": runs}


def scenario_pipeline(b: Bench) -> dict:
    duration, concurrency = b.d(10, 3), 256
    nats = b.nats()
    up_child, up = b.fake_upstream(0, 0, 64)
    w = b.worker(nats, tei_url=up)
    b.wait_workers(nats, [w])
    gw_child, gw = b.gateway(nats)
    procs = {"gateway": gw_child, "worker": w.child, "nats-server": nats.child,
             "fake-upstream": up_child}
    runs = []
    for target in (gw, nats.target()):
        # No warm-up, so CPU time and request counts cover exactly the same requests.
        r = b.load(f"{target.path} c={concurrency}", target, concurrency=concurrency, warmup=0,
                   duration=duration, measure_cpu_of=procs, workers=[w])
        runs.append(run_entry(target.path, {"path": target.path, "concurrency": concurrency}, r))
    return {"settings": {"upstream": "fake-upstream 0 ms + 0 us/input, concurrency 64 (instant)",
                         "worker": w.settings, "duration_s": duration,
                         "concurrency": concurrency},
            "runs": runs}


def scenario_scaling(b: Bench) -> dict:
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
            _, gw = b.gateway(nats, request_timeout="10s")
            r = b.load(f"gateway, {n} worker(s), c={per_worker * n}", gw,
                       concurrency=per_worker * n, warmup=warmup, duration=duration, timeout=10,
                       workers=workers)
            runs.append(run_entry("gateway", {"path": "gateway", "workers": n,
                                              "concurrency": per_worker * n}, r))
            settings = workers[0].settings
        finally:
            b.sup.stop_since(mark)
    per_worker_capacity = BATCH / (SLOW_BASE_MS / 1e3 + BATCH * SLOW_PER_INPUT_US / 1e6)
    return {"settings": {"upstream": f"one fake-upstream per worker, {SLOW_BASE_MS} ms + "
                                     f"{SLOW_PER_INPUT_US} us/input, concurrency 1",
                         "worker": settings, "gateway": {"REQUEST_TIMEOUT": "10s"},
                         "timeout_s": 10, "warmup_s": warmup, "duration_s": duration,
                         "per_worker_capacity": per_worker_capacity},
            "runs": runs}


def scenario_tuning(b: Bench) -> dict:
    rate = 1500
    waits = [1, 5] if b.quick else [1, 2, 5, 10]
    batches = [8, 32] if b.quick else [8, 32, 64]
    warmup, duration = b.d(1, 1), b.d(6, 3)
    nats = b.nats()
    _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
    _, gw = b.gateway(nats)
    runs = []
    for wait in waits:
        for batch in batches:
            w = b.worker(nats, tei_url=up, MAX_WAIT_TIME=f"{wait}ms", MAX_BATCH_SIZE=str(batch))
            try:
                b.wait_workers(nats, [w])
                r = b.load(f"wait {wait} ms, batch {batch}", gw, rate=rate, warmup=warmup,
                           duration=duration, workers=[w])
            finally:
                b.stop_worker(nats, w, 0)
            runs.append(run_entry("gateway", {"path": "gateway", "rate": rate,
                                              "max_wait_ms": wait, "max_batch_size": batch}, r))
    return {"settings": {"upstream": f"fake-upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} us/input,"
                                     " concurrency 1", "rate": rate,
                         "worker": {k: v for k, v in WORKER_DEFAULTS.items()
                                    if k not in ("MAX_WAIT_TIME", "MAX_BATCH_SIZE")},
                         "warmup_s": warmup, "duration_s": duration},
            "runs": runs}


def scenario_overload(b: Bench) -> dict:
    cap_warmup, cap_duration = b.d(2, 1), b.d(5, 3)
    warmup, duration = b.d(2, 1), b.d(12, 4)
    runs = []
    # GPU-like upstream: direct and through embatch.
    mark = b.sup.mark()
    try:
        nats = b.nats()
        _, up = b.fake_upstream(GPU_BASE_MS, GPU_PER_INPUT_US, 1)
        w = b.worker(nats, tei_url=up)
        b.wait_workers(nats, [w])
        _, gw = b.gateway(nats, request_timeout="2s")
        gpu_worker = w.settings
        for target, c in ((Target("direct", ["--url", up + "/embed"]), 8), (gw, 512)):
            cap = b.load(f"{target.path} capacity c={c}", target, concurrency=c,
                         warmup=cap_warmup, duration=cap_duration)
            capacity = goodput(cap)
            over = b.load(f"{target.path} @ 2x capacity", target, rate=2 * capacity,
                          warmup=warmup, duration=duration,
                          workers=[w] if target.path != "direct" else ())
            runs.append(run_entry(target.path, {"upstream": "gpu", "path": target.path,
                                                "capacity": capacity, "capacity_run": cap,
                                                "rate": 2 * capacity}, over))
    finally:
        b.sup.stop_since(mark)
    # The built-in CPU model through embatch.
    corpus = corpus_path()
    mark = b.sup.mark()
    try:
        _, w, gw = cpu_model_stack(b, "2s")
        cap = b.load("cpu model capacity c=128", gw, concurrency=128, warmup=b.d(3, 2),
                     duration=cap_duration, corpus=corpus)
        capacity = goodput(cap)
        over = b.load("cpu model @ 2x capacity", gw, rate=2 * capacity, warmup=warmup,
                      duration=duration, corpus=corpus, workers=[w])
        runs.append(run_entry("gateway", {"upstream": "cpu", "path": "gateway",
                                          "capacity": capacity, "capacity_run": cap,
                                          "rate": 2 * capacity}, over))
        cpu_worker = w.settings
    finally:
        b.sup.stop_since(mark)
    return {"settings": {"gpu_upstream": f"fake-upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} "
                                         "us/input, concurrency 1",
                         "cpu_upstream": "built-in CPU model", "gpu_worker": gpu_worker,
                         "cpu_worker": cpu_worker, "gateway": {"REQUEST_TIMEOUT": "2s"},
                         "timeout_s": 2, "capacity_runs": "closed loop: direct c=8, "
                         "embatch c=512 (GPU-like), c=128 (CPU model)",
                         "warmup_s": warmup, "duration_s": duration,
                         "corpus": corpus or "generated"},
            "runs": runs}


SCENARIO_FUNCS = {
    "gpu_rates": scenario_gpu_rates,
    "low_load": scenario_low_load,
    "cpu_model": scenario_cpu_model,
    "pipeline": scenario_pipeline,
    "scaling": scenario_scaling,
    "tuning": scenario_tuning,
    "overload": scenario_overload,
}


# --------------------------------------------------------------------------------------------
# RESULTS.md


def find(runs: list[dict], **match) -> dict | None:
    for run in runs:
        if all(run.get(k) == v for k, v in match.items()):
            return run["report"]
    return None


def render_gpu_rates(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    out = [
        f"Fake upstream {GPU_BASE_MS} ms + {GPU_PER_INPUT_US} µs/input, one call at a time; "
        f"one worker (MAX_BATCH_SIZE {BATCH}, MAX_WAIT_TIME {MAX_WAIT_MS} ms); single-input "
        f"requests, open loop (latency from the scheduled send time), 2 s timeout. Direct "
        f"saturates at 1/5.02 ms ≈ {DIRECT_CAPACITY:.0f} req/s; the ceiling with full batches "
        f"of {BATCH} is {BATCH}/5.64 ms ≈ {CEILING:,.0f} req/s. Completed = answered in any "
        "way (including errors) per second; goodput = successes within the timeout per second; "
        "p50/p99 are of the successes.",
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
                       f" | {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))}"
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
            ok = best[0] >= 0.95 * CEILING
            targets.append((f"1. GPU-like, via {path}: sustains ≥ 95% of the {CEILING:,.0f} "
                            "req/s ceiling with p99 ≤ 25 ms",
                            f"{best[0]:,} req/s offered = {best[0] / CEILING:.1%} of the ceiling "
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
    out = [f"Open loop at {s['rate']} req/s (≈ 20, chosen so arrivals are not phase-locked to "
           "the 1 ms timer ticks), GPU-like upstream, MAX_WAIT_TIME "
           f"{s['max_wait_ms']} ms: a lone request waits MAX_WAIT_TIME for company, the price of "
           "batching at low load.", "",
           "| path | p50 ms | p90 ms | p99 ms | added p50 vs direct | worker queue wait (mean) "
           "| errors |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for path in ("direct", "gateway", "nats"):
        r = find(runs, path=path)
        if r is None:
            continue
        added = "-"
        if path != "direct" and direct and lat(r, "p50_ms") is not None:
            added = f"+{lat(r, 'p50_ms') - lat(direct, 'p50_ms'):.2f} ms"
        wait = (r.get("batches") or {}).get("mean_queue_wait_ms")
        wait = "-" if wait is None else f"{wait:.2f} ms"
        out.append(f"| {path} | {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p90_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | {added} | {wait} | {failures(r)} |")
    gw = find(runs, path="gateway")
    if direct and gw and lat(gw, "p50_ms") is not None:
        added = lat(gw, "p50_ms") - lat(direct, "p50_ms")
        limit = s["max_wait_ms"] + 1
        targets.append((f"2. Low load: added p50 of the gateway path ≤ MAX_WAIT_TIME + 1 ms "
                        f"= {limit} ms", f"+{added:.2f} ms", added <= limit))
    return out


def render_cpu_model(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    s = res["settings"]
    out = [f"Worker with the built-in model (all-MiniLM-L6-v2 on the CPU, no TEI), through the "
           f"gateway, closed loop, inputs from {Path(s['corpus']).name if '/' in s['corpus'] else s['corpus']}, "
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
           "/proc/PID/stat over the run, divided by the requests completed).", "",
           "| path | req/s | p50 ms | p99 ms | " + " | ".join(f"{p} µs/req" for p in procs)
           + " | cores busy |",
           "|---|---:|---:|---:|" + "---:|" * len(procs) + "---:|"]
    for run in runs:
        r = run["report"]
        n = max(1, r["requests"]["sent"])
        cpu = r.get("cpu_s", {})
        cells = [f"{cpu[p] * 1e6 / n:.0f}" if p in cpu and (run["path"] != "nats" or p != "gateway")
                 else "-" for p in procs]
        busy = f"{sum(cpu.values()) / r['cpu_wall_s']:.2f}" if r.get("cpu_wall_s") else "-"
        out.append(f"| {run['path']} | {fmt_rate(throughput(r))} | {fmt_ms(lat(r, 'p50_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | " + " | ".join(cells) + f" | {busy} |")
    return out


def render_scaling(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    s = res["settings"]
    out = [f"Each worker has its own fake upstream ({SLOW_BASE_MS} ms + {SLOW_PER_INPUT_US} "
           f"µs/input, one call at a time: ≈ {s['per_worker_capacity']:.0f} req/s per worker at "
           f"batch {BATCH}); load through the gateway, closed loop with 160 requests in flight "
           "per worker, 10 s timeout.", "",
           "| workers | throughput req/s | × one worker | p50 ms | p99 ms | errors |",
           "|---:|---:|---:|---:|---:|---|"]
    one = find(runs, workers=1)
    for run in runs:
        r = run["report"]
        x = f"{goodput(r) / goodput(one):.2f}×" if one and goodput(one) > 0 else "-"
        out.append(f"| {run['workers']} | {fmt_rate(goodput(r))} | {x} | "
                   f"{fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))} | {failures(r)} |")
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
                   f"{fmt_rate(goodput(r))} | {fmt_ms(lat(r, 'p50_ms'))} | "
                   f"{fmt_ms(lat(r, 'p99_ms'))} | {'-' if mb is None else f'{mb:.1f}'} | "
                   f"{fmt_rate(calls)} | {fmt_ms(b.get('mean_queue_wait_ms'))} | {failures(r)} |")
    return out


def render_overload(res: dict, targets: list) -> list[str]:
    runs = res["runs"]
    out = ["Open loop at twice the capacity measured just before (closed loop, same stack), 2 s "
           "client timeout, gateway REQUEST_TIMEOUT 2 s. Goodput counts successes within 2 s; an "
           "answer later than 2 s is a `timeout`, so the p99 of successes cannot exceed 2 s and "
           "the timeouts and 504s show work done too late.",
           "",
           "| upstream | path | capacity req/s | offered req/s | goodput req/s | goodput / "
           "capacity | success p99 ms | 429s | 429 p99 ms | errors |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        r = run["report"]
        cap = run["capacity"]
        n429 = (r.get("failures") or {}).get("429", 0)
        up = "GPU-like" if run["upstream"] == "gpu" else "CPU model"
        path = "direct" if run["path"] == "direct" else "embatch (gateway)"
        ratio = goodput(r) / cap if cap else 0
        out.append(f"| {up} | {path} | {fmt_rate(cap)} | {fmt_rate(run['rate'])} | "
                   f"{fmt_rate(goodput(r))} | {ratio:.0%} | {fmt_ms(lat(r, 'p99_ms'))} | "
                   f"{n429:,} | {fmt_ms(kind_latency(r, '429', 'p99_ms'))} | {failures(r)} |")
        if run["path"] == "gateway":
            p99 = lat(r, "p99_ms")
            rej = kind_latency(r, "429", "p99_ms")
            targets.append((f"7. Overload, {up}: goodput ≥ 90% of capacity", f"{ratio:.0%}",
                            ratio >= 0.9))
            targets.append((f"7. Overload, {up}: p99 of successes < 2 s",
                            f"{fmt_ms(p99)} ms", p99 is not None and p99 < 2000))
            targets.append((f"7. Overload, {up}: p99 of 429 rejections ≤ 50 ms",
                            f"{fmt_ms(rej)} ms ({n429:,} rejections)",
                            rej is not None and rej <= 50))
    return out


RENDERERS = {
    "gpu_rates": render_gpu_rates,
    "low_load": render_low_load,
    "cpu_model": render_cpu_model,
    "pipeline": render_pipeline,
    "scaling": render_scaling,
    "tuning": render_tuning,
    "overload": render_overload,
}


def render(out_dir: Path) -> str:
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
        sections += ["", f"### {title}", ""]
        res = results.get(name)
        if res is None:
            sections.append("_Not run._")
            continue
        sections += RENDERERS[name](res, targets)
        sections += ["", f"_Measured {res['started']}, load average {res['loadavg_before']:.2f} "
                         f"before the scenario, {res['wall_s']:.0f} s._"]
    lines = ["## Benchmarks", "",
             f"Machine: {meta.get('cores', '?')} cores ({meta.get('cpu', '?')}), "
             f"{meta.get('kernel', '?')}; "
             f"{meta.get('date', '?')}; 1-minute load average {meta.get('loadavg_start', 0):.2f} "
             f"at the start; commit {meta.get('commit', '?')}.", "",
             f"Command: `{meta.get('command', 'python3 loadtest/bench.py')}` "
             "(raw JSON: `loadtest/results/<scenario>.json`)"
             + (f"; sections not rerun come from `{meta['previous'].get('command')}` "
                f"({meta['previous'].get('date')})" if meta.get("previous") else "")
             + ".", "",
             "Everything runs on one machine: the load generator, nats-server, the gateway, "
             "the worker(s) and the upstream share its cores, so CPU-bound numbers are lower "
             "bounds of what separate machines would do.", "",
             "| target | measured | |", "|---|---|---|"]
    for label, value, ok in targets:
        lines.append(f"| {label} | {value} | {verdict(ok)} |")
    return "\n".join(lines + sections) + "\n"


# --------------------------------------------------------------------------------------------
# Main


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
    missing = {"embatch-gateway", "embatch-worker", "embatch-loadtest"} - bins.keys()
    if missing:
        raise BenchError(f"cargo build produced no {', '.join(sorted(missing))}")
    return bins


def machine_info(command: str) -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL).stdout.strip()
        if dirty:
            commit += " (with uncommitted changes)"
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu,
            "kernel": f"{platform.system()} {platform.release()}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg_start": load_average(), "commit": commit or "?", "command": command}


def wait_idle(max_wait: float, threshold: float) -> None:
    deadline = time.monotonic() + max_wait
    while load_average() >= threshold and time.monotonic() < deadline:
        log(f"load average {load_average():.2f} ≥ {threshold}: waiting for the machine to calm "
            "down")
        time.sleep(15)


def on_terminate(signum, frame):
    raise Terminated(f"signal {signum}")


README_START = "<!-- bench:start (generated by loadtest/bench.py; edits here are overwritten) -->"
README_END = "<!-- bench:end -->"


def write_results(out_dir: Path) -> None:
    """Writes RESULTS.md and, for the default results directory, splices the same text into the
    README between README_START and README_END (its "Benchmarks" section)."""
    text = render(out_dir)
    (out_dir / "RESULTS.md").write_text(text)
    log(f"wrote {out_dir / 'RESULTS.md'}")
    if out_dir.resolve() != RESULTS_DIR.resolve():
        return
    readme = REPO / "README.md"
    content = readme.read_text()
    start, end = content.find(README_START), content.find(README_END)
    if start < 0 or end < start:
        log("README.md has no benchmark markers; not updated")
        return
    # RESULTS.md starts with its own "## Benchmarks" heading; the README section has one already.
    body = text.split("\n", 1)[1] if text.startswith("## ") else text
    readme.write_text(content[: start + len(README_START)] + "\n" + body.strip() + "\n"
                      + content[end:])
    log(f"updated {readme}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    parser.add_argument("--render-only", action="store_true",
                        help="only regenerate RESULTS.md from the JSON files")
    args = parser.parse_args()
    if sys.platform != "linux":
        print("bench.py needs Linux (/proc)", file=sys.stderr)
        return 2
    out_dir = args.out or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        write_results(out_dir)
        return 0

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGHUP, on_terminate)
    command = "python3 loadtest/bench.py" + "".join(
        f" {a}" for a in sys.argv[1:])
    log_dir = Path(tempfile.mkdtemp(prefix="embatch-bench-"))
    bench = None
    failed = []
    try:
        bins = {}
        if args.no_build:
            for name in ("embatch-gateway", "embatch-worker", "embatch-loadtest"):
                bins[name] = str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
                                 / "release" / name)
        else:
            bins = build()
        nats_bin = subprocess.run([str(REPO / "scripts" / "install-nats-server.sh")], cwd=REPO,
                                  check=True, stdout=subprocess.PIPE,
                                  text=True).stdout.strip().splitlines()[-1]
        if args.wait_idle > 0:
            wait_idle(args.wait_idle, args.max_load)
        names = args.only or SCENARIO_NAMES
        meta = machine_info(command)
        if args.only and (out_dir / "machine.json").is_file():
            meta["previous"] = json.loads((out_dir / "machine.json").read_text())
        (out_dir / "machine.json").write_text(json.dumps(meta, indent=2) + "\n")
        log(f"{meta['cores']} cores, load average {meta['loadavg_start']:.2f}; logs in {log_dir}")
        bench = Bench(args, bins, nats_bin, log_dir, out_dir)
        for name in names:
            title = dict(SCENARIOS)[name]
            log(f"== {title}")
            started = time.monotonic()
            info = {"scenario": name, "title": title, "quick": args.quick,
                    "started": datetime.datetime.now(datetime.timezone.utc).strftime(
                        "%Y-%m-%d %H:%M UTC"),
                    "loadavg_before": load_average(), "command": command}
            mark = bench.sup.mark()
            try:
                result = SCENARIO_FUNCS[name](bench)
            except BenchError as e:
                log(f"scenario {name} failed: {e}")
                failed.append(name)
                continue
            finally:
                bench.sup.stop_since(mark)
            info["wall_s"] = time.monotonic() - started
            info.update(result)
            (out_dir / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
        write_results(out_dir)
    except (KeyboardInterrupt, Terminated) as e:
        log(f"interrupted ({e.__class__.__name__}): stopping everything")
        return 130
    except BenchError as e:
        log(f"error: {e}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if bench is not None:
            bench.sup.stop_all()
        log(f"process logs: {log_dir}")
    if failed:
        log(f"failed scenarios: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
