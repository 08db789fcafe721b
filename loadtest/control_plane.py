#!/usr/bin/env python3
"""What the control plane costs: N workers and G gateways on one nats-server (or a 3-node
cluster, --cluster 3), for each (N, G) given, idle or under an open loop of requests (--load). Idle, a worker publishes nothing on NATS: it beats on
`<subject>.alive` only while it holds a request it acknowledged over 100 ms ago, asks `<model subject>.room` only while it is
full, and announces itself on `<subject>.members` once at start and once at stop; a gateway asks
discovery only on demand (docs/design/control-plane.md). Each worker still probes its upstream's
/health every second (HTTP, not NATS). (Until build 5705bd2 every worker beat every 100 ms and
announced its membership every 0.5 s to every worker and gateway: N² messages.)

For each run: start nats-server, one fake upstream (all workers share it; it computes N calls at
once, one simulated GPU per worker, each call --upstream-ms plus 20 µs per input), G gateways and N
workers; wait until all are up and idle; then over --seconds, from nats-server's /varz, the
messages it received and delivered per second, and from /proc, the CPU (user + system) of
nats-server, of the workers (mean per worker) and of the gateways (mean per gateway), as a
share of one core. Prints a Markdown table; --json writes the raw numbers.

--load RATE: while measuring, `embatch-loadtest run --rate RATE` sends distinct single-input
requests to the first gateway's /embed (open loop, 3 s of warm-up first); with --spread, one
loader per gateway sends RATE / G to each. Messages are then also
split by subject: nats-server's /connz?subs=detail counts what each subscription was delivered,
so deliveries to `*.alive` (heartbeats), `*.room`, `*.members` and `$SRV.>` (discovery
questions) are the control plane, the rest (request subjects and reply inboxes, which also carry
the few discovery and room answers) the requests.

--cluster 3: three nats-server processes with routes on loopback (core NATS, no JetStream);
workers and gateways connect to the nodes in turn (worker i to node i mod 3). Messages and CPU
are then also given per node (a node's /varz counts route traffic too).

Usage: loadtest/control_plane.py --bin-dir DIR [--runs 10x1,100x1,100x4] [--seconds 10]
  [--load RATE [--spread]] [--cluster 3] [--upstream-ms MS]
  DIR holds release builds of embatch-worker, embatch-gateway and embatch-loadtest.
  NATS_SERVER_BIN (or scripts/install-nats-server.sh) is the nats-server.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


CONTROL = (("heartbeats", lambda s: s.endswith(".alive")), ("room", lambda s: s.endswith(".room")),
           ("members", lambda s: s.endswith(".members")), ("discovery", lambda s: s.startswith("$SRV.")))


def subject_kind(subject: str) -> str:
    """The control-plane part a subscription's subject belongs to, or `requests`."""
    return next((kind for kind, match in CONTROL if match(subject)), "requests")


def deliveries(monitor: int) -> dict:
    """What each subscription of one node was delivered so far: {(cid, sid): (subject, msgs)}."""
    url = f"http://127.0.0.1:{monitor}/connz?subs=detail&limit=100000"
    with urllib.request.urlopen(url, timeout=10) as r:
        conns = json.load(r)["connections"] or []
    return {(c["cid"], s["sid"]): (s["subject"], s.get("msgs", 0))
            for c in conns for s in c.get("subscriptions_list_detail") or []}


def start_nats(nats_bin: str, nodes: int, procs: list) -> list[tuple]:
    """Starts `nodes` nats-server processes (routes between them when more than one); returns
    [(process, client port, monitor port)] once each answers /varz and, in a cluster, has routes
    to all others."""
    ports = [(free_port(), free_port(), free_port()) for _ in range(nodes)]
    out = []
    for i, (client, monitor, route) in enumerate(ports):
        args = [nats_bin, "-a", "127.0.0.1", "-p", str(client), "-m", str(monitor), "-n", f"n{i + 1}"]
        if nodes > 1:
            args += ["--cluster_name", "embatch", "--cluster", f"nats://127.0.0.1:{route}", "--routes",
                     ",".join(f"nats://127.0.0.1:{r}" for j, (_, _, r) in enumerate(ports) if j != i)]
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        out.append((p, client, monitor))
    deadline = time.time() + 20
    for _, _, monitor in out:
        while not wait_http(f"http://127.0.0.1:{monitor}/varz", 1) or routes(monitor) < nodes - 1:
            if time.time() > deadline:
                raise RuntimeError("nats-server (cluster) not up")
            time.sleep(0.2)
    return out


def routes(monitor: int) -> int:
    """Routes the node has to other nodes now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/routez", timeout=5) as r:
        return len(json.load(r).get("routes") or [])


def spawn(bin_dir: str, name: str, env: dict, procs: list) -> subprocess.Popen:
    p = subprocess.Popen([os.path.join(bin_dir, name)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    procs.append(p)
    return p


def wait_connected(nodes: list[tuple], want: int, seconds: float) -> None:
    deadline = time.time() + seconds
    while (have := sum(varz(m)["connections"] for _, _, m in nodes)) < want:
        if time.time() > deadline:
            raise RuntimeError(f"only {have} of {want} connected")
        time.sleep(0.2)


def start_load(bin_dir: str, gateway_port: int, rate: float, seconds: float, tmp: str, procs: list):
    """An open loop of distinct single-input requests to one gateway's /embed, 3 s of warm-up
    first; returns (process, path of its JSON report)."""
    report = os.path.join(tmp, f"load-{gateway_port}.json")
    p = subprocess.Popen([os.path.join(bin_dir, "embatch-loadtest"), "run", "--url",
                          f"http://127.0.0.1:{gateway_port}/embed", "--rate", str(rate), "--warmup", "3s",
                          "--duration", f"{int(seconds) + 2}s", "--json", report, "-q"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p)
    return p, report


def run(bin_dir: str, nats_bin: str, workers: int, gateways: int, seconds: float, load: float | None,
        cluster: int, upstream_ms: int = 5, spread: bool = False) -> dict:
    procs: list[subprocess.Popen] = []
    tmp = tempfile.mkdtemp(prefix="embatch-control-plane-")
    try:
        nodes = start_nats(nats_bin, cluster, procs)
        up_port = free_port()
        # One simulated GPU per worker, as in a fleet: the upstream is never the bottleneck.
        procs.append(subprocess.Popen([os.path.join(bin_dir, "embatch-loadtest"), "fake-upstream",
                                       "--listen", f"127.0.0.1:{up_port}", "--concurrency", str(workers),
                                       "--base-ms", str(upstream_ms)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not wait_http(f"http://127.0.0.1:{up_port}/health", 10):
            raise RuntimeError("fake upstream not up")
        env = dict(os.environ, RUST_LOG="warn")
        url = lambda i: f"nats://127.0.0.1:{nodes[i % cluster][1]}"  # noqa: E731
        gateway_ports = [free_port() for _ in range(gateways)]
        gateway_procs = [spawn(bin_dir, "embatch-gateway", dict(env, NATS_URL=url(i),
                                                                LISTEN_ADDR=f"127.0.0.1:{port}"), procs)
                         for i, port in enumerate(gateway_ports)]
        worker_procs = [spawn(bin_dir, "embatch-worker", dict(env, NATS_URL=url(i), TEI_URL=f"http://127.0.0.1:{up_port}",
                                                              METRICS_ADDR="", CACHE="false", BULK="false"), procs)
                        for i in range(workers)]
        # Up: every worker and gateway connected, then a few seconds for start-up work to settle.
        wait_connected(nodes, workers + gateways, 60 + workers * 0.2)
        time.sleep(5)
        loaders = []
        if load:
            targets = gateway_ports if spread else gateway_ports[:1]
            loaders = [start_load(bin_dir, port, load / len(targets), seconds, tmp, procs)
                       for port in targets]
            time.sleep(3.5)
        if [p for p in procs if p.poll() is not None]:
            raise RuntimeError("a process exited")
        return measure(nodes, worker_procs, gateway_procs, seconds, loaders, workers, gateways, cluster, load)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def measure(nodes, worker_procs, gateway_procs, seconds, loaders, workers, gateways, cluster, load) -> dict:
    """Messages (per node and by subject) and CPU over `seconds`; `loaders`: [(process, report
    path)], one per gateway that takes load."""
    monitors = [m for _, _, m in nodes]
    pids = [p.pid for p, _, _ in nodes] + [p.pid for p in worker_procs + gateway_procs]
    pids += [p.pid for p, _ in loaders]
    v0, d0, c0, t0 = ([varz(m) for m in monitors], [deliveries(m) for m in monitors],
                      {p: cpu_ticks(p) for p in pids}, time.time())
    time.sleep(seconds)
    v1, d1, c1, t1 = ([varz(m) for m in monitors], [deliveries(m) for m in monitors],
                      {p: cpu_ticks(p) for p in pids}, time.time())
    wall = t1 - t0

    def core(ps: list[int]) -> float:
        """Mean share of one core per process of `ps`."""
        return sum(c1[p] - c0[p] for p in ps) / HZ / wall / max(1, len(ps))

    by_kind: dict[str, float] = {k: 0.0 for k, _ in CONTROL}
    by_kind["requests"] = 0.0
    for before, after in zip(d0, d1):
        for key, (subject, msgs) in after.items():
            by_kind[subject_kind(subject)] += (msgs - before.get(key, (subject, 0))[1]) / wall
    result = {
        "workers": workers, "gateways": gateways, "nodes": cluster, "load_rate": load or 0,
        "seconds": round(wall, 2),
        "in_msgs_per_s": sum(b["in_msgs"] - a["in_msgs"] for a, b in zip(v0, v1)) / wall,
        "out_msgs_per_s": sum(b["out_msgs"] - a["out_msgs"] for a, b in zip(v0, v1)) / wall,
        "in_bytes_per_s": sum(b["in_bytes"] - a["in_bytes"] for a, b in zip(v0, v1)) / wall,
        "per_node": [{"in_msgs_per_s": (b["in_msgs"] - a["in_msgs"]) / wall,
                      "out_msgs_per_s": (b["out_msgs"] - a["out_msgs"]) / wall,
                      "core": core([p.pid])} for a, b, (p, _, _) in zip(v0, v1, nodes)],
        "delivered_per_s_by_kind": by_kind,
        "nats_core": core([p.pid for p, _, _ in nodes]) * len(nodes),
        "worker_core_mean": core([p.pid for p in worker_procs]),
        "gateway_core_mean": core([p.pid for p in gateway_procs]),
    }
    if loaders:
        result["loadgen_core"] = core([p.pid for p, _ in loaders]) * len(loaders)
        reports = []
        for p, path in loaders:
            p.wait(timeout=60)
            with open(path) as f:
                report = json.load(f)
            reports.append({k: report.get(k) for k in ("requests", "failures", "goodput", "latency")})
        # One loader: its report as it is; one per gateway (--spread): each gateway's.
        result["load_report"] = reports[0] if len(reports) == 1 else reports
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--runs", default="10x1,50x1,100x1,100x4")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--load", type=float, help="requests per second through the first gateway")
    parser.add_argument("--cluster", type=int, default=1, choices=(1, 3), help="nats-server nodes")
    parser.add_argument("--upstream-ms", type=int, default=5,
                        help="each upstream call's fixed cost, ms (one simulated GPU per worker)")
    parser.add_argument("--spread", action="store_true",
                        help="split --load evenly over every gateway (one loader each), so every "
                             "gateway has requests in flight and hears heartbeats")
    parser.add_argument("--json")
    args = parser.parse_args()
    nats_bin = os.environ.get("NATS_SERVER_BIN") or subprocess.run(
        [os.path.join(REPO, "scripts", "install-nats-server.sh")], capture_output=True, text=True,
        check=True).stdout.strip()
    results = []
    for spec in args.runs.split(","):
        workers, gateways = (int(x) for x in spec.split("x"))
        r = run(args.bin_dir, nats_bin, workers, gateways, args.seconds, args.load, args.cluster,
                args.upstream_ms, args.spread)
        print(f"{workers} workers, {gateways} gateways: {json.dumps(r)}", file=sys.stderr, flush=True)
        results.append(r)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def print_table(results: list[dict]) -> None:
    print("| workers | gateways | nodes | load, req/s | messages in/s | delivered/s | of which control "
          "plane (beats / room / members / discovery) | nats-server, % of a core | per node, msgs in/s "
          "and % of a core | per worker, % of a core | per gateway, % of a core |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|")
    for r in results:
        k = r["delivered_per_s_by_kind"]
        control = sum(k[c] for c, _ in CONTROL)
        nodes = "; ".join(f"{n['in_msgs_per_s']:,.0f}, {100 * n['core']:.1f}" for n in r["per_node"])
        print(f"| {r['workers']} | {r['gateways']} | {r['nodes']} | {r['load_rate']:,.0f} | "
              f"{r['in_msgs_per_s']:,.0f} | {r['out_msgs_per_s']:,.0f} | {control:,.0f} ("
              f"{k['heartbeats']:,.0f} / {k['room']:,.0f} / {k['members']:,.0f} / {k['discovery']:,.0f}) | "
              f"{100 * r['nats_core']:.1f} | {nodes} | {100 * r['worker_core_mean']:.2f} | "
              f"{100 * r['gateway_core_mean']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
