"""Processes: started in their own session, logged to files, stopped by PID; free ports, waiting,
CPU accounting. Linux only (CPU time is read from /proc/PID/stat)."""

from __future__ import annotations

import os
import resource
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CLK_TCK = os.sysconf("SC_CLK_TCK")
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class BenchError(Exception):
    """A scenario could not run (a process died, a port never opened, a run failed)."""


class Terminated(Exception):
    """SIGTERM or SIGHUP: stop like on Ctrl-C."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port(taken: set[int]) -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise BenchError("no free loopback port")


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


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
            # Own process group: a Ctrl-C in the terminal reaches only the bench, which then
            # stops its children in order. Not a session of its own: with Linux's
            # sched_autogroup (kernel.sched_autogroup_enabled), each session is a scheduling
            # group that gets an equal share of the CPU however many threads it runs, so on a
            # saturated box every process would get the same share whatever its load; in the
            # bench's session they share the cores by thread, as when started from one shell
            # (see "Where the CPU goes").
            process_group=0,
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

    def kill(self, child: Child, sig: int = signal.SIGKILL, wait: float = 5.0) -> None:
        """Sends `sig` to `child` (a crash: `kill -9` by default) and waits up to `wait` s for it
        to exit. It stays among `children`, so `stop_since` still closes its log. Safe to call from
        a timer thread while the main thread waits for something else."""
        if child.popen.poll() is None:
            # Popen.send_signal signals only while the child is not yet reaped: never a reused PID.
            child.popen.send_signal(sig)
            try:
                child.popen.wait(wait)
            except subprocess.TimeoutExpired:
                log(f"warning: {child.name} (pid {child.pid}) still running after signal {sig}")

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
