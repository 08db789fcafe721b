"""The lines every check program prints, and the exit status they add up to.

`check(good, msg)` prints `ok <msg>` or `fail <msg>` and counts the failures; `info(msg)` prints
`info <msg>`; `status()` is the program's exit status: 1 after any failure, else 0. Lines are
flushed at once, so that a long check shows its progress in CI's log as it goes.
"""

failures = 0


def check(good, msg):
    global failures
    failures += not good
    print(("ok " if good else "fail ") + msg, flush=True)


def info(msg):
    print("info " + msg, flush=True)


def status():
    return 1 if failures else 0
