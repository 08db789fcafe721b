#!/usr/bin/env python3
"""Cross-region cost: two NATS regions joined by NATS gateways (a supercluster), with a delay
added between them, and requests sent in region A.

One stack per row: nats-server for region A and for region B (the repository's
nats/regions/region-a.conf and region-b.conf, every port rewritten to a free one, each
gateway's `advertise` and the other region's gateway URL pointed at a delay proxy), one worker
on the fake upstream (instant, `embatch-loadtest fake-upstream`), and the load generator's
closed loop on region A's server (`embatch-loadtest run --nats`, subject `embed`, distinct
single inputs). The worker runs in A (the local case) or in B (A has none: NATS queue groups
then route A's requests to B over the gateway).

The delay proxy forwards each gateway connection and holds every chunk it reads for
`--delay-ms` before writing it on, in both directions, so a request and its reply each cross
the regions once: the round trip grows by 2 x the delay. Standard library only.

    cargo build --release -p embatch-worker -p embatch-loadtest
    python3 loadtest/regions_delay.py --delays 0,5,25 --concurrency 8 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class DelayProxy:
    """A TCP proxy on a thread of its own: listens on `port`, forwards to `target`, and holds
    each chunk `delay` seconds (in both directions, order kept)."""

    def __init__(self, target: int, delay: float):
        self.port, self.target, self.delay = free_port(), target, delay
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        wait_port(self.port)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self.loop.run_until_complete(server.serve_forever())

    async def _serve(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                             return_exceptions=True)

    async def _pump(self, reader, writer) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if chunk is None:
                    writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        while True:
            chunk = await reader.read(65536)
            queue.put_nowait((time.monotonic() + self.delay, chunk or None))
            if not chunk:
                break
        await sender


def region_config(src: str, ports: dict, own: str, advertise: int, urls: dict) -> str:
    """The repository's region config with its ports rewritten and the gateway URLs (and this
    server's advertised gateway address) pointed at the proxies."""
    text = (REPO / "nats" / "regions" / src).read_text()
    for old, new in ports.items():
        text = text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    text = re.sub(r"\{name: A, urls: \[[^\]]*\]\}", f'{{name: A, urls: ["nats://127.0.0.1:{urls["A"]}"]}}', text)
    text = re.sub(r"\{name: B, urls: \[[^\]]*\]\}", f'{{name: B, urls: ["nats://127.0.0.1:{urls["B"]}"]}}', text)
    text = text.replace(f"name: {own}\n", f'name: {own}\n  advertise: "127.0.0.1:{advertise}"\n', 1)
    return text


def wait_gateways(http_port: int, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            out = subprocess.run(["curl", "-sf", f"http://127.0.0.1:{http_port}/gatewayz"],
                                 capture_output=True, text=True, timeout=2).stdout
            gw = json.loads(out)
            if gw.get("outbound_gateways", {}).get("B") and gw.get("inbound_gateways", {}).get("B"):
                return
        except (subprocess.SubprocessError, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the regions did not join")


def run_row(args, where: str, delay_ms: float) -> dict:
    procs = []
    tmp = Path(tempfile.mkdtemp(prefix="regions-delay-"))
    try:
        a = {4231: free_port(), 8231: free_port(), 7231: free_port(), 7431: free_port()}
        b = {4232: free_port(), 8232: free_port(), 7232: free_port()}
        to_a, to_b = DelayProxy(a[7231], delay_ms / 1000), DelayProxy(b[7232], delay_ms / 1000)
        urls = {"A": to_a.port, "B": to_b.port}
        (tmp / "a.conf").write_text(region_config("region-a.conf", a, "A", to_a.port, urls))
        (tmp / "b.conf").write_text(region_config("region-b.conf", b, "B", to_b.port, urls))
        for name in ("a", "b"):
            procs.append(subprocess.Popen([args.nats_server_bin, "-c", str(tmp / f"{name}.conf")],
                                          stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "w")))
        wait_port(a[4231])
        wait_port(b[4232])
        wait_gateways(a[8231])
        bins = Path(args.bin_dir)
        up_log = tmp / "up.log"
        procs.append(subprocess.Popen([str(bins / "embatch-loadtest"), "fake-upstream", "--base-ms", "0",
                                       "--per-input-us", "0", "--concurrency", "64"],
                                      stdout=open(up_log, "w"), stderr=subprocess.STDOUT))
        for _ in range(100):
            if up_log.stat().st_size:
                break
            time.sleep(0.05)
        up_addr = up_log.read_text().split()[2]
        nats_port = a[4231] if where == "A" else b[4232]
        env = dict(os.environ, NATS_URL=f"nats://127.0.0.1:{nats_port}", TEI_URL=f"http://{up_addr}",
                   METRICS_ADDR="", CACHE="false", BULK="false", RUST_LOG="warn")
        procs.append(subprocess.Popen([str(bins / "embatch-worker")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=open(tmp / "worker.log", "w")))
        time.sleep(args.settle)
        report = tmp / "report.json"
        subprocess.run([str(bins / "embatch-loadtest"), "run", "--nats", f"nats://127.0.0.1:{a[4231]}",
                        "-c", str(args.concurrency), "-d", f"{args.seconds}s", "--timeout", "5s",
                        "--json", str(report), "--quiet"], check=True, capture_output=True)
        return json.loads(report.read_text())
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", default=str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release"))
    p.add_argument("--nats-server-bin", default=os.environ.get("NATS_SERVER_BIN", str(REPO / ".bin" / "nats-server")))
    p.add_argument("--delays", default="0,5,25", help="one-way delays between the regions, ms, comma-separated")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--settle", type=float, default=2.0)
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    rows = [("A", 0.0)] + [("B", float(d)) for d in args.delays.split(",")]
    print("| worker in | one-way delay ms | req/s | p50 ms | p99 ms | failures |")
    print("|---|---:|---:|---:|---:|---:|")
    out = []
    for where, delay in rows:
        report = run_row(args, where, delay)
        row = {
            "worker": where, "delay_ms": delay,
            "req_s": report["throughput"]["requests_per_s"],
            "p50_ms": (report.get("latency") or {}).get("p50_ms"),
            "p99_ms": (report.get("latency") or {}).get("p99_ms"),
            "failures": report["requests"]["failed"],
            "report": report,
        }
        out.append(row)
        print(f"| {where} | {delay:g} | {row['req_s']:,.0f} | {row['p50_ms']} | {row['p99_ms']} | {row['failures']} |",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
