#!/usr/bin/env python3
"""Memory with large inputs: the peak RSS of the worker, the gateway and nats-server while
clients keep many large single-input requests in flight.

One fresh stack per run: nats-server (the shipped nats/nats.conf's max_payload 8 MB and
max_pending 256 MB, JetStream on a temp store), the GPU-like fake upstream
(`embatch-loadtest fake-upstream`, its defaults), one worker on its defaults (plus any
`--worker-env`), and for `--via gateway` the gateway on its defaults. Once the stack is idle,
each process's RSS is read (`VmRSS`), its peak is reset (`/proc/PID/clear_refs`, 5), the load
runs, and the peak is read (`VmHWM`). The figure is the peak minus the idle RSS, in MiB.

The load: `--requests` requests, `--in-flight` at a time (closed loop), each one distinct text
of `--input-bytes` (random words; distinct, since the worker de-duplicates equal inputs) with
`"truncate": true`:
- `--via direct`: on the worker's NATS subject `embed`, with `Embatch-Deadline-Ms`, over a raw
  NATS connection (the NATS protocol by hand, no client library);
- `--via gateway`: `POST /embed` on the gateway, the text cut so the body fits the gateway's
  `MAX_BODY_BYTES` (2 MiB).

The worker's bound is 4 x MAX_QUEUE_BYTES above idle (256 MiB with the default 64 MiB); the
gateway and nats-server are shown against what the requests in flight carry (`--in-flight` x the
body). Standard library only.

    cargo build --release -p embatch-worker -p embatch-gateway -p embatch-loadtest
    python3 loadtest/memory.py                      # 100 in flight, 400 requests, direct
    python3 loadtest/memory.py --via gateway --runs 3
    python3 loadtest/memory.py --worker-env TOKENIZER=models/all-MiniLM-L6-v2/tokenizer.json

Exit status 1 when a run's worker peak is over its bound (`--check`), 2 when the stack fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# The gateway's MAX_BODY_BYTES default: the largest /embed body it takes.
GATEWAY_MAX_BODY = 2 * MIB
# The worker's MAX_QUEUE_BYTES default.
DEFAULT_MAX_QUEUE_BYTES = 64 * MIB


class StackError(Exception):
    """A process of the stack did not start or died."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise StackError(f"no {field} for pid {pid}")


def reset_peak(pid: int) -> bool:
    """Resets the process's VmHWM to its current RSS (Linux 4.0+); False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def wait_until(what: str, ready, seconds: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise StackError(f"{what}: a process exited with {p.returncode}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise StackError(f"timed out waiting for {what}")


def http_status(url: str) -> int:
    try:
        with NO_PROXY.open(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Stack:
    """nats-server, the fake upstream, a worker and optionally the gateway, in a temp dir."""

    def __init__(self, args: argparse.Namespace, gateway: bool):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="embatch-memory-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("RUST_LOG", "http_proxy", "HTTP_PROXY", "https_proxy",
                                 "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}
        self.env.update({"RUST_LOG": os.environ.get("EMBATCH_MEMORY_RUST_LOG", "warn"), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
                         "HF_HUB_OFFLINE": "1"})
        try:
            self._start(gateway)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None,
               stdout=None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(argv, env={**self.env, **(env or {})},
                             stdout=stdout if stdout is not None else log, stderr=log,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def _start(self, gateway: bool) -> None:
        a = self.args
        self.nats_port = free_port()
        conf = self.tmp / "nats.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{self.nats_port}\nmax_payload: 8MB\nmax_pending: 256MB\n"
            f'write_deadline: "10s"\njetstream {{ store_dir: "{self.tmp / "js"}" }}\n')
        nats = self._spawn("nats-server", [a.nats_server_bin, "-c", str(conf)])
        wait_until("nats-server", lambda: socket.create_connection(
            ("127.0.0.1", self.nats_port), 0.2).close() is None, 15, [nats])
        nats_url = f"nats://127.0.0.1:{self.nats_port}"

        upstream = self._spawn("fake-upstream", [a.loadtest_bin, "fake-upstream",
                                                 "--listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE)
        line = upstream.stdout.readline().decode()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            raise StackError(f"fake upstream: {line!r}")
        tei_url = f"http://{match.group(1)}"

        metrics = free_port()
        worker_env = {"NATS_URL": nats_url, "TEI_URL": tei_url,
                      "METRICS_ADDR": f"127.0.0.1:{metrics}"}
        worker_env.update(dict(kv.split("=", 1) for kv in a.worker_env))
        worker = self._spawn("worker", [a.worker_bin], worker_env)
        wait_until("the worker", lambda: http_status(
            f"http://127.0.0.1:{metrics}/health") == 200, 60, [nats, worker])
        self.gateway_url = None
        if gateway:
            port = free_port()
            gw = self._spawn("gateway", [a.gateway_bin],
                             {"NATS_URL": nats_url, "LISTEN_ADDR": f"127.0.0.1:{port}"})
            wait_until("the gateway", lambda: http_status(
                f"http://127.0.0.1:{port}/health") == 200, 30, [nats, worker, gw])
            self.gateway_url = ("127.0.0.1", port)
        self.nats_url = ("127.0.0.1", self.nats_port)

    def measured(self) -> dict[str, int]:
        """The pids whose memory is reported, by name."""
        names = ["worker", "nats-server"] + (["gateway"] if self.gateway_url else [])
        return {n: self.procs[n].pid for n in names}

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise StackError(f"{name} exited with {p.returncode} (logs in {self.tmp})")

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def texts(count: int, size: int, seed: int):
    """`count` distinct texts of `size` ASCII bytes: windows at distinct offsets of one buffer
    of random words (no JSON escaping needed)."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                          for _ in range(rng.randint(2, 10))) for _ in range(5000)]
    stride = 1009
    words, length = [], 0
    while length < size + stride * count + 16:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    buffer = " ".join(words).encode()
    return lambda i: buffer[i * stride: i * stride + size]


def body(text: bytes) -> bytes:
    return b'{"inputs":"' + text + b'","truncate":true}'


def load_direct(stack: Stack, args: argparse.Namespace) -> dict[str, int]:
    """The requests over one raw NATS connection, `args.in_flight` at a time; reply outcomes
    counted by status (`200` or the `Nats-Service-Error-Code`)."""
    text = texts(args.requests, args.input_bytes, args.seed)
    sock = socket.create_connection(stack.nats_url)
    reader = sock.makefile("rb")
    if not reader.readline().startswith(b"INFO"):
        raise StackError("nats-server sent no INFO")
    write_lock = threading.Lock()

    def send(data: bytes) -> None:
        with write_lock:
            sock.sendall(data)

    send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
         b'"protocol":1,"name":"memory-bench"}\r\nPING\r\n')
    if reader.readline().strip() != b"PONG":
        raise StackError("nats-server did not answer PING")
    send(b"SUB _INBOX.mem.* 1\r\n")
    window = threading.Semaphore(args.in_flight)
    outcomes: dict[str, int] = {}
    examples: dict[str, str] = {}
    done = threading.Event()
    received = [0]
    headers = f"NATS/1.0\r\nEmbatch-Deadline-Ms: {args.deadline_ms}\r\n\r\n".encode()

    def read_replies() -> None:
        while received[0] < args.requests:
            line = reader.readline()
            if not line:
                break
            if line.startswith(b"PING"):
                send(b"PONG\r\n")
                continue
            parts = line.split()
            if parts[0] == b"MSG":
                payload = reader.read(int(parts[-1]) + 2)
                status = "200"
            elif parts[0] == b"HMSG":
                header_len, total = int(parts[-2]), int(parts[-1])
                payload = reader.read(total + 2)
                head = payload[:header_len].decode(errors="replace")
                code = re.search(r"Nats-Service-Error-Code:\s*(\d+)", head)
                inline = re.match(r"NATS/1\.0 (\d+)", head)
                if code:
                    status = code.group(1)
                    message = re.search(r"Nats-Service-Error:\s*(.*)", head)
                    if message and status not in examples:
                        examples[status] = message.group(1).strip()[:200]
                elif inline:
                    status = f"nats-{inline.group(1)}"
                else:
                    status = "200"
            else:
                continue
            outcomes[status] = outcomes.get(status, 0) + 1
            received[0] += 1
            window.release()
        done.set()

    threading.Thread(target=read_replies, daemon=True).start()
    for i in range(args.requests):
        while not window.acquire(timeout=1):
            stack.check_alive()
        payload = body(text(i))
        send(b"HPUB embed _INBOX.mem.%d %d %d\r\n" % (i, len(headers),
                                                      len(headers) + len(payload))
             + headers + payload + b"\r\n")
    if not done.wait(args.deadline_ms / 1000 + 30):
        outcomes["no_reply"] = args.requests - received[0]
    sock.close()
    for status, message in sorted(examples.items()):
        print(f"  {status}: {message}", flush=True)
    return outcomes


def load_gateway(stack: Stack, args: argparse.Namespace) -> dict[str, int]:
    """The requests as `POST /embed`, `args.in_flight` threads each with its own connection."""
    size = min(args.input_bytes, GATEWAY_MAX_BODY - len(body(b"")))
    text = texts(args.requests, size, args.seed)
    next_index = [0]
    lock = threading.Lock()
    outcomes: dict[str, int] = {}

    def client() -> None:
        conn = http.client.HTTPConnection(*stack.gateway_url, timeout=args.deadline_ms / 1000)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= args.requests:
                break
            try:
                conn.request("POST", "/embed", body(text(i)),
                             {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = str(response.status)
            except (OSError, http.client.HTTPException) as e:
                status = type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection(*stack.gateway_url,
                                                  timeout=args.deadline_ms / 1000)
            with lock:
                outcomes[status] = outcomes.get(status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(args.in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def one_run(args: argparse.Namespace, via: str) -> dict:
    stack = Stack(args, gateway=via == "gateway")
    try:
        time.sleep(args.settle)
        pids = stack.measured()
        idle = {n: status_kib(p, "VmRSS") for n, p in pids.items()}
        reset = all(reset_peak(p) for p in pids.values())
        started = time.monotonic()
        outcomes = (load_gateway if via == "gateway" else load_direct)(stack, args)
        elapsed = time.monotonic() - started
        stack.check_alive()
        peak = {n: status_kib(p, "VmHWM") for n, p in pids.items()}
    finally:
        stack.stop()
    return {"via": via, "idle_kib": idle, "peak_kib": peak, "peak_reset": reset,
            "outcomes": outcomes, "seconds": round(elapsed, 1)}


def bound_mib(args: argparse.Namespace, name: str) -> float:
    if name == "worker":
        queue = next((int(kv.split("=", 1)[1]) for kv in args.worker_env
                      if kv.startswith("MAX_QUEUE_BYTES=")), DEFAULT_MAX_QUEUE_BYTES)
        return 4 * queue / MIB
    return args.in_flight * (args.input_bytes + 64) / MIB


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    release = REPO / "target" / "release"
    p.add_argument("--via", choices=["direct", "gateway", "both"], default="direct")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--in-flight", type=int, default=100)
    p.add_argument("--input-bytes", type=int, default=2 * MIB)
    p.add_argument("--deadline-ms", type=int, default=60_000)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--settle", type=float, default=2.0, help="idle seconds before measuring")
    p.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--worker-bin", default=str(release / "embatch-worker"))
    p.add_argument("--gateway-bin", default=str(release / "embatch-gateway"))
    p.add_argument("--loadtest-bin", default=str(release / "embatch-loadtest"))
    p.add_argument("--nats-server-bin", default=os.environ.get(
        "NATS_SERVER_BIN", str(REPO / ".bin" / "nats-server")))
    p.add_argument("--json", help="also write the runs as JSON to this file")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a worker peak is over 4 x MAX_QUEUE_BYTES above idle")
    p.add_argument("--keep", action="store_true", help="keep the logs' temp directory")
    args = p.parse_args()

    vias = ["direct", "gateway"] if args.via == "both" else [args.via]
    print(f"# {args.requests} requests, {args.in_flight} in flight, {args.input_bytes} B "
          f"inputs, truncate: true; worker {args.worker_bin} {' '.join(args.worker_env)}",
          flush=True)
    runs, over = [], False
    for via in vias:
        for n in range(args.runs):
            try:
                run = one_run(args, via)
            except StackError as e:
                print(f"stack failed: {e}", file=sys.stderr)
                return 2
            runs.append(run)
            cells = []
            for name, peak in run["peak_kib"].items():
                above = (peak - run["idle_kib"][name]) / 1024
                bound = bound_mib(args, name)
                over |= name == "worker" and above > bound
                cells.append(f"{name} {above:.0f} MiB (idle {run['idle_kib'][name] / 1024:.0f},"
                             f" bound {bound:.0f})")
            outcomes = " ".join(f"{k}:{v}" for k, v in sorted(run["outcomes"].items()))
            print(f"{via} run {n + 1}: peak above idle: {'; '.join(cells)}; replies {outcomes}; "
                  f"{run['seconds']} s" + ("" if run["peak_reset"] else " (peak not reset)"),
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 1 if over and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
