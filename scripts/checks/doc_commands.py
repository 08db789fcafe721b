#!/usr/bin/env python3
"""Prints the compose commands that documentation shows, one per line as `FILE<TAB>COMMAND`:

- in Markdown files, the lines of fenced code blocks that start with `docker compose` or `curl`;
- in compose.yaml, comment lines whose text starts with `docker compose` or `curl`.

A trailing `# comment` is dropped and runs of blanks are collapsed. scripts/compose-e2e.sh checks
that it ran each of them as written. Usage: doc_commands.py FILE...
"""
import re
import sys

PREFIXES = ("docker compose ", "curl ")


def clean(line):
    line = re.sub(r"\s+#\s.*$", "", line.strip())
    return " ".join(line.split())


def commands(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if path.endswith(".md"):
        fenced = False
        for line in lines:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif fenced and line.strip().startswith(PREFIXES):
                yield clean(line)
    else:
        for line in lines:
            m = re.match(r"^#\s+(.*)$", line)
            if m and m.group(1).startswith(PREFIXES):
                yield clean(m.group(1))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        for command in commands(path):
            print(f"{path}\t{command}")
