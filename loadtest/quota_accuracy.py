#!/usr/bin/env python3
"""Quota accuracy across gateways: one tenant offered twice its `requests_per_minute`, through
several gateways at once, and what the fleet served in each quota window.

One stack: nats-server, the fake upstream (instant), one worker, and `--gateways` gateways on
one tenants file holding the tenant `q` with `requests_per_minute = --limit`. One open-loop
load generator per gateway (`embatch-loadtest run --rate`), together offering `--offered` ×
the limit, spread evenly over the gateways, with distinct single inputs. Quota windows are
fixed, `QUOTA_WINDOW` (60 s) long and aligned to Unix time (docs/tenants.md), so the script
reads every gateway's `embatch_gateway_tenant_requests_total{tenant="q",status="200"}` just
after each window boundary and reports, for each whole window inside the run, the requests the
fleet served against the limit. The gateways share their counts on core NATS every 100 ms; what
a fleet may overshoot is about the peers' rate × 100 ms.

    cargo build --release -p embatch-gateway -p embatch-worker -p embatch-loadtest
    python3 loadtest/quota_accuracy.py --limit 1200 --windows 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-quota-bench"
SERVED = re.compile(r'^embatch_gateway_tenant_requests_total\{([^}]*)\} (\S+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200")


def served(port: int) -> tuple[float, float]:
    """The tenant's requests answered 200 and 429 by the gateway on `port` so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    ok = refused = 0.0
    for labels, value in SERVED.findall(text):
        if 'tenant="q"' not in labels:
            continue
        if 'status="200"' in labels:
            ok += float(value)
        elif 'status="429"' in labels:
            refused += float(value)
    return ok, refused


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def stack(args, tmp: Path, procs: list) -> list[int]:
    """Starts nats-server, the fake upstream, the worker and the gateways; their HTTP ports."""
    bins = Path(args.bin_dir)
    nats_port = free_port()
    procs.append(subprocess.Popen([args.nats_server_bin, "-p", str(nats_port), "-a", "127.0.0.1"],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp / "nats.log", "w")))
    up_log = tmp / "up.log"
    procs.append(start([str(bins / "embatch-loadtest"), "fake-upstream", "--base-ms", "0",
                        "--per-input-us", "0", "--concurrency", "64"], dict(os.environ), up_log))
    for _ in range(100):
        if up_log.stat().st_size:
            break
        time.sleep(0.05)
    up_addr = up_log.read_text().split()[2]
    tenants = tmp / "tenants.toml"
    tenants.write_text(f'[tenants.q]\nkeys = ["{KEY}"]\nrequests_per_minute = {args.limit}\n')
    base = dict(os.environ, NATS_URL=f"nats://127.0.0.1:{nats_port}", TENANTS_FILE=str(tenants),
                RUST_LOG="warn")
    procs.append(start([str(bins / "embatch-worker")],
                       dict(base, TEI_URL=f"http://{up_addr}", METRICS_ADDR="", CACHE="false",
                            BULK="false"), tmp / "worker.log"))
    ports = []
    for i in range(args.gateways):
        port = free_port()
        procs.append(start([str(bins / "embatch-gateway")],
                           dict(base, LISTEN_ADDR=f"127.0.0.1:{port}"), tmp / f"gateway{i}.log"))
        ports.append(port)
    for port in ports:
        wait_http(f"http://127.0.0.1:{port}/health")
    return ports


def measure(args, ports: list[int], tmp: Path, procs: list) -> list[dict]:
    """Runs the load from the next window boundary for `--windows` whole windows and reads the
    counts at each boundary."""
    bins = Path(args.bin_dir)
    now = time.time()
    first = (int(now // 60) + 1) * 60  # the first whole window starts here
    rate = args.limit / 60 * args.offered / len(ports)
    seconds = first - now + args.windows * 60 + 2
    loads = [start([str(bins / "embatch-loadtest"), "run", "--url", f"http://127.0.0.1:{port}/embed",
                    "--api-key", KEY, "--rate", f"{rate:.3f}", "-d", f"{seconds:.0f}s",
                    "--timeout", "5s", "--seed", str(100 + i), "--quiet",
                    "--json", str(tmp / f"load{i}.json")], dict(os.environ), tmp / f"load{i}.log")
             for i, port in enumerate(ports)]
    procs.extend(loads)
    marks = []
    for w in range(args.windows + 1):
        time.sleep(max(0.0, first + w * 60 + args.read_after - time.time()))
        counts = [served(p) for p in ports]
        marks.append((sum(c[0] for c in counts), sum(c[1] for c in counts)))
    rows = []
    for w in range(args.windows):
        ok = marks[w + 1][0] - marks[w][0]
        refused = marks[w + 1][1] - marks[w][1]
        rows.append({"window_start_unix": first + w * 60, "served": int(ok), "refused_429": int(refused),
                     "limit": args.limit, "error_pct": 100.0 * (ok - args.limit) / args.limit})
    for p in loads:
        p.wait(timeout=seconds + 30)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", default=str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release"))
    p.add_argument("--nats-server-bin", default=os.environ.get("NATS_SERVER_BIN", str(REPO / ".bin" / "nats-server")))
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--limit", type=int, default=1200, help="the tenant's requests_per_minute")
    p.add_argument("--offered", type=float, default=2.0, help="load offered, as a multiple of the limit")
    p.add_argument("--windows", type=int, default=3, help="whole quota windows (60 s) to measure")
    p.add_argument("--read-after", type=float, default=0.3,
                   help="seconds after each window boundary at which the counts are read")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    procs: list = []
    tmp = Path(tempfile.mkdtemp(prefix="quota-accuracy-"))
    try:
        ports = stack(args, tmp, procs)
        rows = measure(args, ports, tmp, procs)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"| window (UTC) | served | limit | error | refused 429 |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        at = time.strftime("%H:%M", time.gmtime(r["window_start_unix"]))
        print(f"| {at} | {r['served']:,} | {r['limit']:,} | {r['error_pct']:+.1f}% | {r['refused_429']:,} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"gateways": args.gateways, "offered": args.offered,
                                               "rows": rows, "logs": str(tmp)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
