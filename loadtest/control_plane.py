#!/usr/bin/env python3
"""What the control plane costs with no request at all: N idle workers and G gateways on one
nats-server, for each (N, G) given. Idle, a worker publishes nothing on NATS: it beats on
`<subject>.alive` only while it holds requests, asks `<model subject>.room` only while it is
full, and announces itself on `<subject>.members` once at start and once at stop; a gateway asks
discovery only on demand (docs/design/control-plane.md). Each worker still probes its upstream's
/health every second (HTTP, not NATS). (Until build 5705bd2 every worker beat every 100 ms and
announced its membership every 0.5 s to every worker and gateway: N² messages.)

For each run: start nats-server, one fake upstream (all workers share it), G gateways and N
workers; wait until all are up and idle; then over --seconds, from nats-server's /varz, the
messages it received and delivered per second, and from /proc, the CPU (user + system) of
nats-server, of the workers (mean per worker) and of the gateways (mean per gateway), as a
share of one core. Prints a Markdown table; --json writes the raw numbers.

Usage: loadtest/control_plane.py --bin-dir DIR [--runs 10x1,100x1,100x4] [--seconds 10]
  DIR holds release builds of embatch-worker, embatch-gateway and embatch-loadtest.
  NATS_SERVER_BIN (or scripts/install-nats-server.sh) is the nats-server.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HZ = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def varz(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as r:
        return json.load(r)


def wait_http(url: str, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def run(bin_dir: str, nats_bin: str, workers: int, gateways: int, seconds: float) -> dict:
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="embatch-control-plane-")
    null = subprocess.DEVNULL
    try:
        client, monitor = free_port(), free_port()
        nats = subprocess.Popen([nats_bin, "-a", "127.0.0.1", "-p", str(client), "-m", str(monitor)],
                                stdout=null, stderr=null)
        procs.append(nats)
        if not wait_http(f"http://127.0.0.1:{monitor}/varz", 10):
            raise RuntimeError("nats-server not up")
        up_port = free_port()
        procs.append(subprocess.Popen([os.path.join(bin_dir, "embatch-loadtest"), "fake-upstream",
                                       "--listen", f"127.0.0.1:{up_port}"], stdout=null, stderr=null))
        if not wait_http(f"http://127.0.0.1:{up_port}/health", 10):
            raise RuntimeError("fake upstream not up")
        env = dict(os.environ, NATS_URL=f"nats://127.0.0.1:{client}", RUST_LOG="warn")
        gateway_procs = []
        for _ in range(gateways):
            port = free_port()
            p = subprocess.Popen([os.path.join(bin_dir, "embatch-gateway")],
                                 env=dict(env, LISTEN_ADDR=f"127.0.0.1:{port}"), stdout=null, stderr=null)
            procs.append(p)
            gateway_procs.append(p)
        worker_procs = []
        for _ in range(workers):
            p = subprocess.Popen([os.path.join(bin_dir, "embatch-worker")],
                                 env=dict(env, TEI_URL=f"http://127.0.0.1:{up_port}", METRICS_ADDR="",
                                          CACHE="false", BULK="false"),
                                 stdout=null, stderr=null)
            procs.append(p)
            worker_procs.append(p)
        # Up: every worker and gateway connected (nats-server counts the connections), then a
        # few seconds for start-up work to settle.
        want = workers + gateways
        deadline = time.time() + 60 + workers * 0.2
        while varz(monitor)["connections"] < want:
            if time.time() > deadline:
                raise RuntimeError(f"only {varz(monitor)['connections']} of {want} connected")
            time.sleep(0.2)
        time.sleep(5)
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{len(dead)} processes exited")
        v0, t0 = varz(monitor), time.time()
        c0 = {p.pid: cpu_ticks(p.pid) for p in [nats] + worker_procs + gateway_procs}
        time.sleep(seconds)
        v1, t1 = varz(monitor), time.time()
        c1 = {p.pid: cpu_ticks(p.pid) for p in [nats] + worker_procs + gateway_procs}
        wall = t1 - t0

        def core(pids: list[int]) -> float:
            """Mean share of one core per process of `pids`."""
            return sum(c1[p] - c0[p] for p in pids) / HZ / wall / max(1, len(pids))

        return {
            "workers": workers, "gateways": gateways, "seconds": round(wall, 2),
            "in_msgs_per_s": (v1["in_msgs"] - v0["in_msgs"]) / wall,
            "out_msgs_per_s": (v1["out_msgs"] - v0["out_msgs"]) / wall,
            "in_bytes_per_s": (v1["in_bytes"] - v0["in_bytes"]) / wall,
            "nats_core": core([nats.pid]),
            "worker_core_mean": core([p.pid for p in worker_procs]),
            "gateway_core_mean": core([p.pid for p in gateway_procs]),
        }
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--runs", default="10x1,50x1,100x1,100x4")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    nats_bin = os.environ.get("NATS_SERVER_BIN") or subprocess.run(
        [os.path.join(REPO, "scripts", "install-nats-server.sh")], capture_output=True, text=True,
        check=True).stdout.strip()
    results = []
    for spec in args.runs.split(","):
        workers, gateways = (int(x) for x in spec.split("x"))
        r = run(args.bin_dir, nats_bin, workers, gateways, args.seconds)
        print(f"{workers} workers, {gateways} gateways: {json.dumps(r)}", file=sys.stderr, flush=True)
        results.append(r)
    print("| workers | gateways | messages in/s | delivered/s | nats-server, % of a core | "
          "per worker, % of a core | per gateway, % of a core |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['workers']} | {r['gateways']} | {r['in_msgs_per_s']:,.0f} | {r['out_msgs_per_s']:,.0f} | "
              f"{100 * r['nats_core']:.1f} | {100 * r['worker_core_mean']:.2f} | {100 * r['gateway_core_mean']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
