"""The binaries' own defaults, read from their `--help` (clap) instead of repeated here.

clap prints, per option, `[env: NAME=]` (or `[env: NAME]` when the value is hidden, or
`[env: NAME=VALUE]` when NAME is set in the environment) and `[default: VALUE]`: on lines of
their own in the long help (`--help` with doc comments longer than one paragraph), at the end of
the description in the short layout. `parse_help` reads both layouts into a dict keyed by the
env var name, or by the long flag (`--timeout`) for options without one; the value is the
default, or None when the option has none. `--help` runs with a bare environment, so a variable
set in ours cannot show up as a value.

    python3 -m loadtest.bench.defaults [BIN_DIR]    # prints what the binaries in BIN_DIR
                                                    # (default target/release) declare
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

# An option's first line: `  -c, --concurrency <CONCURRENCY>` or `      --quiet`.
OPTION = re.compile(r"^\s{2,}(?:-\w,\s+)?--([\w-]+)")
ENV = re.compile(r"\[env:\s*([A-Za-z_][A-Za-z0-9_]*)(?:=([^\]]*))?\]")
DEFAULT = re.compile(r"\[default:\s*([^\]]*)\]")
SECTION = re.compile(r"^\S")  # `Options:`, `Commands:`, `Usage: ...`: ends an option's text


class DefaultsError(Exception):
    """A binary's --help could not be run or did not declare a default the bench relies on."""


def parse_help(text: str) -> dict[str, str | None]:
    """{ENV_NAME or --flag: default or None} for every option of a clap `--help` text."""
    options: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = OPTION.match(line)
        if m:
            options.append((m.group(1), [line]))
        elif SECTION.match(line):
            options.append(("", []))  # a section heading closes the current option
        elif options:
            options[-1][1].append(line)
    out: dict[str, str | None] = {}
    for flag, lines in options:
        if not flag or flag in ("help", "version"):
            continue
        block = " ".join(lines)
        env = ENV.search(block)
        default = DEFAULT.search(block)
        key = env.group(1) if env else f"--{flag}"
        out[key] = default.group(1).strip() if default else None
    return out


def help_text(exe: str, *subcommand: str) -> str:
    # A bare environment: clap would print `[env: NAME=our value]` for variables we have set.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    try:
        proc = subprocess.run([exe, *subcommand, "--help"], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DefaultsError(f"could not run {exe} {' '.join(subcommand)} --help: {e}")
    if proc.returncode != 0:
        raise DefaultsError(f"{exe} {' '.join(subcommand)} --help exited with "
                            f"{proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def parse_duration_ms(value: str) -> int | float:
    """`5ms`, `2s`, `1m`, `250us` (humantime, one unit) in milliseconds; an int when whole."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|sec|m|min|h)?\s*", value)
    if not m:
        raise DefaultsError(f"not a duration: {value!r}")
    scale = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1, None: 1e3, "s": 1e3, "sec": 1e3,
             "m": 60e3, "min": 60e3, "h": 3600e3}[m.group(2)]
    ms = float(m.group(1)) * scale
    return int(ms) if ms == int(ms) else ms


class BinaryDefaults:
    """The defaults of embatch-gateway, embatch-worker and `embatch-loadtest run` /
    `fake-upstream`, each a dict from `parse_help`."""

    def __init__(self, gateway: dict, worker: dict, loadtest_run: dict, fake_upstream: dict):
        self.gateway = gateway
        self.worker = worker
        self.loadtest_run = loadtest_run
        self.fake_upstream = fake_upstream

    @classmethod
    def read(cls, bins: dict[str, str]) -> "BinaryDefaults":
        return cls(parse_help(help_text(bins["embatch-gateway"])),
                   parse_help(help_text(bins["embatch-worker"])),
                   parse_help(help_text(bins["embatch-loadtest"], "run")),
                   parse_help(help_text(bins["embatch-loadtest"], "fake-upstream")))

    def as_dict(self) -> dict[str, dict]:
        return {"embatch-gateway": self.gateway, "embatch-worker": self.worker,
                "embatch-loadtest run": self.loadtest_run,
                "embatch-loadtest fake-upstream": self.fake_upstream}

    @staticmethod
    def _get(table: dict, key: str, binary: str) -> str:
        value = table.get(key)
        if value is None:
            raise DefaultsError(f"{binary} --help declares no default for {key}")
        return value

    def worker_default(self, key: str) -> str:
        return self._get(self.worker, key, "embatch-worker")

    def gateway_default(self, key: str) -> str:
        return self._get(self.gateway, key, "embatch-gateway")

    @property
    def subject(self) -> str:
        """EMBATCH_SUBJECT, which the gateway and the worker must agree on."""
        gw, wk = self.gateway_default("EMBATCH_SUBJECT"), self.worker_default("EMBATCH_SUBJECT")
        if gw != wk:
            raise DefaultsError(f"default subjects differ: gateway {gw!r}, worker {wk!r}")
        return wk

    @property
    def max_batch_size(self) -> int:
        return int(self.worker_default("MAX_BATCH_SIZE"))

    @property
    def max_wait_ms(self) -> int | float:
        return parse_duration_ms(self.worker_default("MAX_WAIT_TIME"))

    def env_names(self) -> set[str]:
        """Every environment variable the binaries read (keys that are not --flags)."""
        return {k for table in self.as_dict().values() for k in table if not k.startswith("-")}


def main(argv: list[str]) -> int:
    repo = Path(__file__).resolve().parents[2]
    bin_dir = Path(argv[0]) if argv else repo / "target" / "release"
    bins = {n: str(bin_dir / n) for n in ("embatch-gateway", "embatch-worker", "embatch-loadtest")}
    try:
        d = BinaryDefaults.read(bins)
        print(json.dumps(d.as_dict(), indent=2))
        print(f"subject {d.subject!r}, max_batch_size {d.max_batch_size}, "
              f"max_wait_ms {d.max_wait_ms}", file=sys.stderr)
    except DefaultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
