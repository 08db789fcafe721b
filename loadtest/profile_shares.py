#!/usr/bin/env python3
"""Shares of a profile's samples by where they are spent, from folded stacks.

Usage: loadtest/profile_shares.py FOLDED...
  FOLDED: `inferno-collapse-perf` output (one line per stack: frames joined by `;`, a space,
  the stack's weight: the sum of its samples' periods, ns of CPU for perf's cpu-clock event,
  which loadtest/flamegraphs.sh records), one file per process, named `<process>.folded`.

Prints a Markdown table: a row per category, a column per file. A stack counts once in a row
when any of its frames matches the row's pattern (or its innermost frame, for the rows of time
spent in a place alone), so the rows overlap (the allocator called by async-nats counts in both)
and do not add up to 100%. `loadtest/flamegraphs.sh` calls it.
"""
import re
import sys
from pathlib import Path

# (row, pattern, where): "any" counts a stack when any of its frames matches (time spent in or
# under it), "own" when the path of any of its frames does, generic arguments left out (so a
# frame of the worker's reply task whose output type names a cache type is not the cache's),
# "leaf" when its innermost frame matches (time spent in it alone). Kernel frames carry the
# `_[k]` suffix of `inferno-collapse-perf --kernel`. The async-nats rows count frames generic
# over its types too: a hash map of its header names, a channel of its messages.
ROWS = [
    ("the allocator (mimalloc)", r"^_?mi_|mimalloc", "any"),
    ("kernel (system calls, loopback TCP, file writes)", r"_\[k\]$", "leaf"),
    ("async-nats in all", r"async_nats::", "any"),
    ("of it, building and parsing message headers", r"async_nats::header::", "any"),
    ("HTTP/1 reads, parsing and writes (hyper, its system calls in)", r"^hyper::proto::h1::(role|io|conn|decode|encode)::", "any"),
    ("the upstream's HTTP client (reqwest, its connection task)", r"^reqwest::|dispatch::Client<", "any"),
    ("the cache (keys, LRU, single-flight, bucket)", r"^embatch_cache::", "own"),
    ("the batcher (actor, queue, admission, the upstream calls it makes)", r"^embatch_batcher::", "own"),
    ("JSON (serde_json)", r"^serde_json::", "own"),
    ("copies (memcpy/memmove)", r"memmove|memcpy", "leaf"),
    ("tracing spans", r"^tracing::|tracing_core::|tracing_subscriber::", "any"),
    ("metrics", r"^metrics::|metrics_util::|metrics_exporter", "any"),
    ("JetStream: storing messages (the cache's bucket)", r"\(\*stream\)\.|\(\*fileStore\)", "any"),
    ("routing a message to its subscribers", r"processInboundClientMsg", "any"),
    ("Go's runtime alone (GC, maps, scheduler)", r"^runtime\.|^internal/runtime/", "leaf"),
]


def own(frame: str) -> str:
    """A Rust frame's own path, without generic arguments: `a::B<T>::f` gives `a::B`,
    `<a::B as c::D>::f` gives `a::B`, `poll<a::B>` gives `poll`."""
    if frame.startswith("<"):
        return re.split(r" as |>", frame[1:], maxsplit=1)[0]
    return frame.split("<", 1)[0]


def matches(pattern: re.Pattern, where: str, frames: list[str]) -> bool:
    """Whether a stack (outermost frame first) counts in a row; see ROWS."""
    if where == "leaf":
        return bool(pattern.search(frames[-1]))
    if where == "own":
        return any(pattern.search(own(f)) for f in frames)
    return any(pattern.search(f) for f in frames)


def shares(path: Path) -> tuple[int, list[float]]:
    """The file's sample count, and each row's share of it (0-1)."""
    total = 0
    hits = [0] * len(ROWS)
    patterns = [(re.compile(p), where) for _, p, where in ROWS]
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for i, (pattern, where) in enumerate(patterns):
            if matches(pattern, where, frames):
                hits[i] += n
    return total, [h / total if total else 0.0 for h in hits]


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    files = [Path(p) for p in paths]
    columns = [shares(f) for f in files]
    names = [f.name.removesuffix(".folded") for f in files]
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    # perf's cpu-clock samples weigh their period, in ns.
    print("| CPU sampled, s | " + " | ".join(f"{t / 1e9:.2f}" for t, _ in columns) + " |")
    for i, (row, _, _) in enumerate(ROWS):
        cells = [s[i] for _, s in columns]
        if all(c < 0.005 for c in cells):
            continue  # a row no process spends 0.5% in (the Go rows for Rust, and back)
        print(f"| {row} | " + " | ".join(f"{c:.0%}" if c >= 0.005 else "-" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
