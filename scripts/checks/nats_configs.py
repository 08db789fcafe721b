#!/usr/bin/env python3
"""Checks the NATS server configs with the nats-server that will run them:

- nats/nats.conf and nats/cluster/*.conf pass `nats-server -c FILE -t`;
- each one, started on its own on free loopback ports, reports the expected max_payload in /varz,
  and JetStream enabled with the expected file store limit (a cluster node gets its store
  directory with -sd, as nats/README.md says).

Whether n1..n3 form a cluster is not checked here: gateway/tests/cluster.rs starts that cluster
from nats/cluster/*.conf (via testkit) and runs the gateway and workers across it.

Usage: nats_configs.py NATS_SERVER   Prints "ok MSG" / "fail MSG" per check (Python 3 stdlib only).
"""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXPECTED_MAX_PAYLOAD = 8 * 1024 * 1024  # 8 MiB, see the arithmetic in nats/nats.conf
EXPECTED_MAX_FILE_STORE = 10 * 1024 ** 3  # jetstream.max_file_store: 10GB in every config
failures = 0


def check(good, msg):
    global failures
    failures += not good
    print(("ok " if good else "fail ") + msg)


def config_files():
    return ["nats/nats.conf"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "nats/cluster/*.conf")))


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together so that they differ)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def syntax_ok(server, conf):
    out = subprocess.run([server, "-c", conf, "-t"], cwd=ROOT, capture_output=True, text=True)
    check(out.returncode == 0, f"{conf}: nats-server -t: {(out.stdout + out.stderr).strip()}")


def varz(port, timeout=10.0):
    """GET /varz from a monitoring port, retrying until the server answers or the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=1) as r:
                return json.load(r)
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def start_alone(server, conf, tmp):
    """Starts CONF on free loopback ports: a wrapper config includes it (include paths are relative
    to the including file) and overrides listen and http; a cluster node gets its own route port
    and a route only to itself (ignored by nats-server), so it never joins a running cluster."""
    client, monitor, route = free_ports(3)
    wrapper = os.path.join(tmp, os.path.basename(conf))
    with open(wrapper, "w") as f:
        f.write(f'include "{os.path.relpath(os.path.join(ROOT, conf), tmp)}"\n'
                f"listen: 127.0.0.1:{client}\nhttp: 127.0.0.1:{monitor}\n")
    args = [server, "-c", wrapper]
    if conf.startswith("nats/cluster/"):
        args += ["--cluster", f"nats://127.0.0.1:{route}", "--routes", f"nats://127.0.0.1:{route}",
                 "-sd", os.path.join(tmp, os.path.basename(conf) + ".store")]
    log = open(wrapper + ".log", "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), client, monitor


def max_payload_ok(server, conf, tmp):
    proc, client, monitor = start_alone(server, conf, tmp)
    try:
        v = varz(monitor) or {}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got = (v.get("port"), v.get("max_payload"))
    js = (v.get("jetstream") or {}).get("config") or {}
    check(js.get("max_storage") == EXPECTED_MAX_FILE_STORE,
          f"{conf}: JetStream on, max_file_store={js.get('max_storage')} "
          f"(want {EXPECTED_MAX_FILE_STORE}), store {js.get('store_dir')}")
    if got == (client, EXPECTED_MAX_PAYLOAD):
        check(True, f"{conf}: starts (on 127.0.0.1:{client}); max_payload={EXPECTED_MAX_PAYLOAD}")
    else:
        with open(os.path.join(tmp, os.path.basename(conf)) + ".log") as f:
            tail = " | ".join(f.read().strip().splitlines()[-3:])
        check(False, f"{conf}: (port, max_payload) = {got}, expected ({client}, "
                     f"{EXPECTED_MAX_PAYLOAD}) (log: {tail})")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: nats_configs.py NATS_SERVER")
    server = sys.argv[1]
    version = subprocess.run([server, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"info using {server} ({version})")
    with tempfile.TemporaryDirectory(prefix="embatch-nats-check-") as tmp:
        for conf in config_files():
            syntax_ok(server, conf)
            max_payload_ok(server, conf, tmp)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
