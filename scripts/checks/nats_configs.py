#!/usr/bin/env python3
"""Checks the NATS server configs with the nats-server that will run them, and that every place
that names a nats-server release names the one pinned in nats/VERSION:

- the nats-server given reports exactly nats/VERSION (scripts/install-nats-server.sh installs it);
- compose.yaml's nats image tag, and the nats subchart's image tag in the Helm values
  (nats.container.image.tag; required in values.yaml, or the subchart runs its own default), name
  the pinned minor (nats:2.15-alpine) or the pinned release (2.15.2-alpine) for v2.15.2;
- nats/nats.conf, nats/cluster/*.conf and nats/regions/*.conf pass `nats-server -c FILE -t`;
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
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import outcome
from outcome import check

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXPECTED_MAX_PAYLOAD = 8 * 1024 * 1024  # 8 MiB, see the arithmetic in nats/nats.conf
EXPECTED_MAX_FILE_STORE = 10 * 1024 ** 3  # jetstream.max_file_store: 10GB in every config
HELM_VALUES = ["deploy/helm/embatch/values.yaml", "deploy/helm/embatch/values-gpu.yaml",
               "deploy/helm/embatch/ci/*.yaml"]


def pinned_version():
    """nats/VERSION: one release tag, e.g. v2.15.2."""
    with open(os.path.join(ROOT, "nats", "VERSION")) as f:
        version = f.read().strip()
    if not re.fullmatch(r"v\d+\.\d+\.\d+", version):
        sys.exit(f"nats/VERSION must hold one release such as v2.15.2, not {version!r}")
    return version


def tag_names_pin(tag, version):
    """An image tag such as 2.15-alpine or 2.15.2-alpine names the pinned minor or release."""
    release = version[1:]
    minor = release.rsplit(".", 1)[0]
    return tag.split("-", 1)[0] in (minor, release)


def yaml_scalar(path, keys):
    """The plain scalar at KEYS (a path of block-mapping keys) in the YAML file PATH, or None.
    Enough for the values files here (block mappings, # comments); no YAML library needed."""
    stack = []  # (indent, key) of the mappings the current line is in
    with open(path) as f:
        for line in f:
            m = re.match(r"^( *)([A-Za-z0-9_.-]+):(?:\s+(.*?))?\s*$", line.split(" #")[0])
            if not m or line.lstrip().startswith("#"):
                continue
            indent, key, value = len(m.group(1)), m.group(2), m.group(3)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key))
            if [k for _, k in stack] == keys and value:
                return value.strip("'\"")
    return None


def versions_pinned(server, version):
    got = subprocess.run([server, "--version"], capture_output=True, text=True).stdout.strip()
    check(got == f"nats-server: {version}",
          f"{server} reports {got!r}; the pin (nats/VERSION) is {version}")
    with open(os.path.join(ROOT, "compose.yaml")) as f:
        images = re.findall(r"^\s*image:\s*[\"']?nats:([^\s\"']+)", f.read(), re.M)
    check(len(images) == 1 and tag_names_pin(images[0], version),
          f"compose.yaml: nats image tag {' '.join(images) or 'missing'} names the pin {version} "
          f"(its minor or release)")
    for pattern in HELM_VALUES:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            rel = os.path.relpath(path, ROOT)
            tag = yaml_scalar(path, ["nats", "container", "image", "tag"])
            if tag is None and not rel.endswith("/values.yaml"):
                continue  # a values file that leaves the tag to values.yaml
            check(tag is not None and tag_names_pin(tag, version),
                  f"{rel}: nats.container.image.tag {tag or 'missing'} names the pin {version} "
                  f"(its minor or release)")


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
    versions_pinned(server, pinned_version())
    with tempfile.TemporaryDirectory(prefix="embatch-nats-check-") as tmp:
        for conf in config_files():
            syntax_ok(server, conf)
            max_payload_ok(server, conf, tmp)
    # The region and edge examples (core NATS, no JetStream) are started as a supercluster by
    # gateway/tests/regions.rs; here their syntax and accounts are checked as written.
    for conf in sorted(glob.glob(os.path.join(ROOT, "nats/regions/*.conf"))):
        syntax_ok(server, os.path.relpath(conf, ROOT))
    sys.exit(outcome.status())


if __name__ == "__main__":
    main()
