#!/usr/bin/env python3
"""Fails when production Rust grows past the house's sizes: a file over 500 lines, or a function
over 80 lines (Python 3 stdlib only; scripts/test.sh runs it first).

Production code: the git-tracked .rs files outside `tests/` folders and `benches/`, other than
files named tests.rs, each up to its first `#[cfg(test)]` (unit tests at the end of a file do not
count). A function's length runs from the line of its `fn` to the line of the brace that closes
its body, found by counting braces with string and char literals and comments skipped (so a
brace inside a string does not count); a function nested in another is measured on its own and
is part of the outer one's length.

Usage: sizes.py [--max-file-lines N] [--max-fn-lines N] [FILE...]
  FILE...  the files to check (default: every production file git tracks, from the repository
           root). Exit 1 naming each file and function over its limit, else 0.
"""
import argparse
import re
import subprocess
import sys

FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\.[^']*|[^\\'])'")


def production_files():
    """The git-tracked .rs files that are not tests or benchmarks."""
    listed = subprocess.run(["git", "ls-files", "*.rs"], capture_output=True, text=True, check=True)
    return [f for f in listed.stdout.split()
            if "/tests/" not in f and not f.startswith("tests/") and f.split("/")[-1] != "tests.rs"
            and "/benches/" not in f and not f.startswith("benches/")]


def strip(line, state):
    """`line` without string and char literals and comments; `state` carries what continues on
    the next line: the block-comment depth and the open string's terminator."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            if line.startswith("*/", i):
                state["block"] -= 1
                i += 2
            elif line.startswith("/*", i):
                state["block"] += 1
                i += 2
            else:
                i += 1
            continue
        if state["str"]:
            end = state["str"]
            if end == '"' and line[i] == "\\":
                i += 2
            elif line.startswith(end, i):
                i += len(end)
                state["str"] = None
            else:
                i += 1
            continue
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] += 1
            i += 2
            continue
        raw = RAW_STRING.match(line, i)
        if raw and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["str"] = '"' + raw.group(1)
            i = raw.end()
            continue
        if line[i] == '"':
            state["str"] = '"'
            i += 1
            continue
        if line[i] == "'":
            char = CHAR.match(line, i)
            if char:
                i = char.end()
                continue
        out.append(line[i])
        i += 1
    return "".join(out)


def measure(lines):
    """(lines before the first `#[cfg(test)]` outside a function, [(line, name, length)] of
    every function in them)."""
    state = {"block": 0, "str": None}
    functions, open_fns, pending, depth = [], [], None, 0
    for number, raw in enumerate(lines, 1):
        if "#[cfg(test)]" in raw and not open_fns:
            return number - 1, functions
        code = strip(raw, state)
        found = FN.search(code)
        if found:
            pending = (found.group(1), number)
        for c in code:
            if c == "{":
                depth += 1
                if pending:
                    open_fns.append((pending[0], pending[1], depth))
                    pending = None
            elif c == "}":
                if open_fns and open_fns[-1][2] == depth:
                    name, start, _ = open_fns.pop()
                    functions.append((start, name, number - start + 1))
                depth -= 1
            elif c == ";" and pending:
                pending = None  # a declaration without a body (a trait's method)
    return len(lines), functions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-file-lines", type=int, default=500)
    parser.add_argument("--max-fn-lines", type=int, default=80)
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    files = args.files or production_files()
    failures = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()  # the empty string after the last newline is not a line
        count, functions = measure(lines)
        if count > args.max_file_lines:
            failures.append("%s: %d lines before #[cfg(test)] (at most %d)"
                            % (path, count, args.max_file_lines))
        for start, name, length in functions:
            if length > args.max_fn_lines:
                failures.append("%s:%d: fn %s is %d lines (at most %d)"
                                % (path, start, name, length, args.max_fn_lines))
    for failure in failures:
        print(failure)
    print("sizes: %d files checked, %d over the limits (files %d lines, functions %d)"
          % (len(files), len(failures), args.max_file_lines, args.max_fn_lines),
          file=sys.stderr if failures else sys.stdout)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
