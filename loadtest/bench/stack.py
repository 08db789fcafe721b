"""The stack a scenario runs on: nats-server, fake upstreams, workers, the gateway and
`embatch-loadtest run`, each on free 127.0.0.1 ports, under one Supervisor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
from pathlib import Path
from typing import Callable

from .defaults import BinaryDefaults
from .procs import (REPO, BenchError, Child, Supervisor, children_cpu_seconds, free_port,
                    http_get, log, port_open, wait_until)
from .report import summary_line

# Not among the binaries' variables (those come from their --help), but must not leak into the
# stack either.
SCRUBBED_ENV = {
    "RUST_LOG", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
    "ALL_PROXY",
}


class Target:
    def __init__(self, path: str, args: list[str]):
        self.path = path  # "direct", "gateway" or "nats"
        self.args = args


class Nats:
    def __init__(self, child: Child, port: int, monitor_port: int, subject: str):
        self.child = child
        self.port = port
        self.monitor_port = monitor_port
        self.subject = subject
        self.url = f"nats://127.0.0.1:{port}"
        # The command line it was started with (restarted with the same one, store included).
        self.argv: list[str] = []

    def subscribers(self) -> int:
        status, body = http_get(
            f"http://127.0.0.1:{self.monitor_port}/subsz?subs=1&limit=100000"
        )
        if status != 200:
            return -1
        subs = json.loads(body).get("subscriptions_list") or []
        return sum(1 for s in subs if s.get("subject") == self.subject)

    def target(self) -> Target:
        return Target("nats", ["--nats", self.url, "--subject", self.subject])


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
                  "embatch_worker_queue_wait_seconds_count",
                  "embatch_worker_batch_tokens_sum", "embatch_worker_batch_padded_tokens_sum")
        totals = dict.fromkeys(wanted, 0.0)
        # Each series summed over its labels: the worker labels every metric with the model it
        # serves (`name{model="..."} value`).
        for line in body.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            if name in totals:
                try:
                    totals[name] += float(value)
                except ValueError:
                    pass
        return totals

    def totals_if_up(self) -> dict[str, float] | None:
        """`totals()`, or None when the worker has exited or its /metrics does not answer (a
        worker a scenario killed)."""
        if not self.child.alive():
            return None
        try:
            return self.totals()
        except (OSError, urllib.error.URLError, BenchError):
            return None


def batch_stats(before: list[dict], after: list[dict], measured_s: float) -> dict:
    """Mean inputs per upstream call, calls per second and mean call time over a window; also
    the window's upstream calls and the inputs they held."""
    delta = {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in after[0]}
    calls = delta["embatch_worker_batch_inputs_count"]
    timed = delta["embatch_worker_upstream_seconds_count"]
    waited = delta["embatch_worker_queue_wait_seconds_count"]
    return {
        "upstream_calls": calls,
        "inputs": delta["embatch_worker_batch_inputs_sum"],
        "mean_queue_wait_ms": (1e3 * delta["embatch_worker_queue_wait_seconds_sum"] / waited
                               if waited else None),
        "mean_batch_inputs": delta["embatch_worker_batch_inputs_sum"] / calls if calls else None,
        "upstream_calls_per_s": calls / measured_s if measured_s > 0 else None,
        # Token counts as the worker knows them (its tokenizer's, or its estimate without one).
        "mean_batch_tokens": delta["embatch_worker_batch_tokens_sum"] / calls if calls else None,
        "padding_ratio": (delta["embatch_worker_batch_tokens_sum"]
                          / delta["embatch_worker_batch_padded_tokens_sum"]
                          if delta["embatch_worker_batch_padded_tokens_sum"] else None),
        "mean_upstream_call_ms": (1e3 * delta["embatch_worker_upstream_seconds_sum"] / timed
                                  if timed else None),
    }


def remove_stores(log_dir: Path) -> int:
    """Deletes the JetStream stores that `Stack.nats` made under `log_dir` (`nats-<port>-store`,
    data such as the embeddings cache's bucket: hundreds of MB per stack under unique inputs),
    keeping the logs; returns the bytes freed. Call once every process has stopped."""
    freed = 0
    for store in log_dir.glob("nats-*-store"):
        for path in store.rglob("*"):
            if path.is_file():
                freed += path.stat().st_size
        shutil.rmtree(store, ignore_errors=True)
    return freed


class Stack:
    """Starts the pieces of a scenario's stack under one Supervisor and runs load against it.

    `worker_base` is the environment every worker starts with (the settings its results record);
    `defaults` are the binaries' own defaults (the subject, the variables to scrub)."""

    def __init__(self, quick: bool, bins: dict[str, str], nats_bin: str, log_dir: Path,
                 defaults: BinaryDefaults, worker_base: dict[str, str]):
        self.quick = quick
        self.bins = bins
        self.nats_bin = nats_bin
        self.defaults = defaults
        self.worker_base = worker_base
        self.subject = defaults.subject
        self.scrubbed = SCRUBBED_ENV | defaults.env_names()
        self.sup = Supervisor(log_dir)
        self.log_dir = log_dir
        self.ports: set[int] = set()
        self.runs = 0
        self._model_dir: str | None = None
        # `--worker-setting`s alone (also in worker_base): for scenarios whose workers run on
        # their defaults (`defaults_only`) but should take what the command line changes.
        self.worker_overrides: dict[str, str] = {}

    # durations: (full, quick) seconds
    def d(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self.scrubbed}
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        # The processes' log filter: warnings only, unless EMBATCH_BENCH_RUST_LOG says otherwise
        # (e.g. `embatch_worker=debug,embatch_batcher=debug` to follow a scenario; logs in the run's log directory).
        env["RUST_LOG"] = os.environ.get("EMBATCH_BENCH_RUST_LOG", "warn")
        env.update(extra or {})
        return env

    def model_dir(self) -> str:
        if self._model_dir is None:
            log("fetching the built-in model (scripts/fetch-model.sh)")
            out = subprocess.run(
                [str(REPO / "scripts" / "fetch-model.sh")], cwd=REPO, check=True,
                stdout=subprocess.PIPE, text=True,
            )
            self._model_dir = out.stdout.strip().splitlines()[-1]
        return self._model_dir

    def nats(self, max_payload: str | None = None) -> Nats:
        """Starts nats-server with JetStream on free ports; `max_payload` (e.g. `8MB`, as
        nats/nats.conf sets it) goes through a config file, since nats-server has no flag for
        it."""
        port, mon = free_port(self.ports), free_port(self.ports)
        # JetStream on, as wherever the stack starts, with its store in the run's log directory
        # (kept across a restart of this server: restart_nats reuses `nats.argv`).
        store = self.log_dir / f"nats-{port}-store"
        argv = [self.nats_bin, "-a", "127.0.0.1", "-p", str(port), "-m", str(mon),
                "-js", "-sd", str(store)]
        if max_payload is not None:
            conf = self.log_dir / f"nats-{port}.conf"
            conf.write_text(f"max_payload: {max_payload}\n")
            argv += ["-c", str(conf)]
        child = self.sup.spawn("nats-server", argv, self.env())
        nats = Nats(child, port, mon, self.subject)
        nats.argv = argv
        wait_until("nats-server", lambda: port_open(port) and nats.subscribers() >= 0, 15,
                   [child])
        return nats

    def fake_upstream(self, base_ms: float, per_input_us: float, concurrency: int,
                      name: str = "fake-upstream", slow_for: str | None = None,
                      slow_delay: str | None = None,
                      extra: list[str] | tuple[str, ...] = ()) -> tuple[Child, str]:
        """Starts `embatch-loadtest fake-upstream`; with `slow_for` and `slow_delay` (humantime
        durations) its calls get `slow_delay` extra for the first `slow_for` after its start (it
        then logs `slow until unix_ms=...` and, at the switch, `fast since unix_ms=...`, see
        `log_value`)."""
        argv = [self.bins["embatch-loadtest"], "fake-upstream", "--listen", "127.0.0.1:0",
                "--base-ms", str(base_ms), "--per-input-us", str(per_input_us),
                "--concurrency", str(concurrency)]
        if slow_for and slow_delay:
            argv += ["--slow-for", slow_for, "--slow-delay", slow_delay]
        argv += list(extra)  # e.g. --per-token-us, --pad-group
        child = self.sup.spawn(name, argv, self.env())
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

    @staticmethod
    def log_value(child: Child, prefix: str) -> str | None:
        """What follows `prefix` on the first line of `child`'s log that starts with it."""
        for line in child.log_path.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        return None

    def worker(self, nats: Nats, *, tei_url: str | None = None, model: bool = False,
               model_dir: str | None = None, name: str = "worker", defaults_only: bool = False,
               **settings: str) -> Worker:
        """Starts a worker with `worker_base` and `settings`, or with `defaults_only` nothing but
        what it must be told (NATS_URL, METRICS_ADDR, TEI_URL or MODEL_DIR) and `settings`;
        `model` with `model_dir`: that built-in model instead of MiniLM."""
        metrics_port = free_port(self.ports)
        env = {} if defaults_only else dict(self.worker_base)
        env.update(settings)
        env["NATS_URL"] = nats.url
        env["METRICS_ADDR"] = f"127.0.0.1:{metrics_port}"
        if tei_url is not None:
            env["TEI_URL"] = tei_url
        elif model:
            env["MODEL_DIR"] = model_dir or self.model_dir()
        else:
            raise BenchError("a worker needs tei_url or model")
        child = self.sup.spawn(name, [self.bins["embatch-worker"]], self.env(env))
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

    def relay(self, nats: Nats, upstream: str) -> Child:
        """Starts `embatch-loadtest nats-relay` on the subject (no worker may be subscribed):
        every request POSTed, unbatched, to `upstream`."""
        child = self.sup.spawn("nats-relay", [self.bins["embatch-loadtest"], "nats-relay",
                                              "--nats", nats.url, "--subject", nats.subject,
                                              "--upstream", upstream], self.env())
        wait_until("the relay to subscribe", lambda: nats.subscribers() == 1, 15, [child])
        return child

    def gateway(self, nats: Nats, request_timeout: str | None) -> tuple[Child, Target]:
        """Starts the gateway; `request_timeout` None leaves REQUEST_TIMEOUT at its default."""
        port = free_port(self.ports)
        env = {"NATS_URL": nats.url, "LISTEN_ADDR": f"127.0.0.1:{port}"}
        if request_timeout is not None:
            env["REQUEST_TIMEOUT"] = request_timeout
        child = self.sup.spawn("gateway", [self.bins["embatch-gateway"]], self.env(env))
        wait_until("the gateway to listen", lambda: port_open(port), 15, [child])
        return child, Target("gateway", ["--url", f"http://127.0.0.1:{port}/embed"])

    def load(self, label: str, target: Target, *, rate: float | None = None,
             concurrency: int | None = None, duration: float, warmup: float,
             timeout: float, corpus: str | None = None, inputs_per_request: int = 1,
             truncate: bool = False,
             extra_args: list[str] | tuple[str, ...] = (),
             workers: list[Worker] = (),
             measure_cpu_of: dict[str, Child] | None = None,
             events: list[tuple[float, str, Callable[[], None]]] = ()) -> dict:
        """Runs `embatch-loadtest run` and returns its JSON report, plus `batches` (from the
        workers' metrics over the measured window; with several workers also
        `batches_by_worker`, in the order of `workers`) and `cpu_s` (per process) when asked.

        A worker whose /metrics cannot be read at the end of the window (one the scenario
        killed) is left out of `batches` and is None in `batches_by_worker`.

        `events`: (offset_s, name, action) — each `action` runs on a timer thread `offset_s`
        after the measured window begins (the end of the warm-up, counted from the loadtest's
        start); the report's `events` say when each one ran (`unix_ms`, comparable with
        `per_second.start_unix_ms`) and whether it raised."""
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
        if inputs_per_request != 1:
            argv += ["--inputs-per-request", str(inputs_per_request)]
        if truncate:
            argv += ["--truncate"]
        argv += list(extra_args)  # e.g. --zipf-unique
        if not any(a in ("--seed", "--zipf-unique", "--corpus") for a in argv):
            # Fresh sentences of their own for each load: the workers' cache (on by default)
            # would answer a later load on the same stack from an earlier one's texts.
            argv += ["--seed", str(42 + self.runs)]
        cpu_before = {n: c.cpu() for n, c in (measure_cpu_of or {}).items()}
        children_before = children_cpu_seconds()
        started = time.monotonic()
        child = self.sup.spawn(f"loadtest-{label}", argv, self.env())
        fired: list[dict] = []
        timers = [threading.Timer(max(0.0, started + warmup + offset - time.monotonic()),
                                  run_event, (fired, offset, name, action))
                  for offset, name, action in events]
        for t in timers:
            t.daemon = True
            t.start()
        try:
            if workers:
                # The workers' counters over the measured window only: from the end of the
                # warm-up to the planned end, not the drain after it.
                time.sleep(max(0.0, started + warmup - time.monotonic()))
                before = [w.totals() for w in workers]
                time.sleep(max(0.0, started + warmup + duration - time.monotonic()))
                window = [w.totals_if_up() for w in workers]
            limit = warmup + duration + timeout + 60
            try:
                child.popen.wait(max(1.0, started + limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(f"loadtest {label} did not finish within {limit:.0f} s")
        finally:
            for t in timers:
                t.cancel()
            for t in timers:
                t.join()
            cpu_after = {n: c.cpu() for n, c in (measure_cpu_of or {}).items() if c.alive()}
            self.sup.stop(child)
        wall = time.monotonic() - started
        if child.popen.returncode != 0:
            raise BenchError(f"loadtest {label} failed:\n{child.log_tail()}")
        report = json.loads(json_path.read_text())
        if workers:
            up = [(b, a) for b, a in zip(before, window) if a is not None]
            report["batches"] = (batch_stats([b for b, _ in up], [a for _, a in up], duration)
                                 if up else None)
            if len(workers) > 1:
                report["batches_by_worker"] = [
                    batch_stats([b], [a], duration) if a is not None else None
                    for b, a in zip(before, window)]
        if events:
            missed = {name for _, name, _ in events} - {e["name"] for e in fired}
            if missed:
                raise BenchError(f"loadtest {label}: {', '.join(sorted(missed))} did not run")
            report["events"] = sorted(fired, key=lambda e: e["unix_ms"])
        if measure_cpu_of is not None:
            report["cpu_s"] = {n: cpu_after[n] - cpu_before[n] for n in cpu_after}
            report["cpu_s"]["loadtest"] = children_cpu_seconds() - children_before
            report["cpu_wall_s"] = wall
        log(f"  {label:<30} {summary_line(report)}")
        time.sleep(self.d(0.5, 0.2))  # let in-flight work drain between runs
        return report


def run_event(fired: list[dict], offset: float, name: str, action: Callable[[], None]) -> None:
    """Runs one of `Stack.load`'s events (on its timer thread) and records when."""
    unix_ms = int(time.time() * 1000)
    error = None
    try:
        action()
    except Exception as e:  # noqa: BLE001 - recorded, and the scenario decides
        error = f"{e.__class__.__name__}: {e}"
        log(f"  event {name} failed: {error}")
    fired.append({"name": name, "planned_offset_s": offset, "unix_ms": unix_ms,
                  "error": error})
