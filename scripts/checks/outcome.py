"""The lines every check program prints, and the exit status they add up to.

`check(good, msg)` prints `ok <msg>` or `fail <msg>` and counts the failures; `info(msg)` prints
`info <msg>`; `status()` is the program's exit status: 1 after any failure, else 0. Lines are
flushed at once, so that a long check shows its progress in CI's log as it goes. `run(commands,
argv)` is the `main` of a program of several checks, one per command.
"""

import sys

failures = 0


def check(good, msg):
    global failures
    failures += not good
    print(("ok " if good else "fail ") + msg, flush=True)


def info(msg):
    print("info " + msg, flush=True)


def status():
    return 1 if failures else 0


def run(commands, argv):
    """Runs the check `argv[1]` names in `commands` (name: function of the remaining arguments)
    and returns the program's exit status: the function's own when it returns one, else
    `status()`. An unknown name exits with a message."""
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd not in commands:
        sys.exit(f"unknown check {cmd}")
    own = commands[cmd](*argv[2:])
    return status() if own is None else own
