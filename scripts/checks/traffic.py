#!/usr/bin/env python3
"""HTTP traffic for scripts/compose-e2e.sh (Python 3 stdlib only).

  traffic.py first200 URL SECONDS
      POSTs one small /embed request every 100 ms until the first 200 or SECONDS. Prints one JSON
      line: {"first_200_s": seconds to the first 200 or null, "refused": attempts that found no
      listener, "answered": {status: count} of every attempt the gateway answered}. An answer that
      is not 200 before the first 200 is what "ready when it can serve" rules out.

  traffic.py trickle URL RATE STOPFILE
      POSTs RATE requests per second (a steady schedule, 16 in flight at most) until STOPFILE
      exists. Prints one JSON line: {"sent": n, "ok": n, "errors": {reason: count}, "p50_ms",
      "p99_ms"}. Any status other than 200, and any connection error or timeout, is an error.

  traffic.py burst URL N CONCURRENCY
      N requests, CONCURRENCY at a time; prints {"sent", "ok", "errors"} as trickle does.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

BODY = json.dumps({"inputs": "compose end-to-end", "normalize": True}).encode()


def post(url, timeout=10.0):
    """(status or None, reason): status is the HTTP status, None when nothing answered."""
    req = urllib.request.Request(url, data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read())
            if resp.status == 200 and not (isinstance(body, list) and len(body) == 1 and len(body[0]) > 0):
                return 200, "200 without one embedding"
            return resp.status, str(resp.status)
    except urllib.error.HTTPError as e:
        return e.code, str(e.code)
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        return None, type(reason).__name__


def first200(url, seconds):
    start = time.monotonic()
    refused = 0
    answered = {}
    while time.monotonic() - start < seconds:
        status, _ = post(url, timeout=5.0)
        if status is None:
            refused += 1
        else:
            answered[str(status)] = answered.get(str(status), 0) + 1
            if status == 200:
                return {"first_200_s": round(time.monotonic() - start, 2), "refused": refused, "answered": answered}
        time.sleep(0.1)
    return {"first_200_s": None, "refused": refused, "answered": answered}


def summarize(results):
    errors = {}
    times = sorted(t for (status, _, t) in results if status == 200)
    for status, reason, _ in results:
        if status != 200:
            errors[reason] = errors.get(reason, 0) + 1
    pct = lambda q: round(times[min(len(times) - 1, int(q * len(times)))] * 1000, 1) if times else None
    return {"sent": len(results), "ok": len(times), "errors": errors, "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def timed(url):
    t = time.monotonic()
    status, reason = post(url)
    if status == 200 and reason != "200":
        status = -1  # a 200 without an embedding
    return status, reason, time.monotonic() - t


def trickle(url, rate, stopfile):
    results = []
    lock = threading.Lock()
    interval = 1.0 / rate
    def one():
        r = timed(url)
        with lock:
            results.append(r)
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        next_at = time.monotonic()
        while not os.path.exists(stopfile):
            pool.submit(one)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    return summarize(results)


def burst(url, n, concurrency):
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return summarize(list(pool.map(lambda _: timed(url), range(n))))


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "first200" and len(argv) == 4:
        out = first200(argv[2], float(argv[3]))
    elif mode == "trickle" and len(argv) == 5:
        out = trickle(argv[2], float(argv[3]), argv[4])
    elif mode == "burst" and len(argv) == 5:
        out = burst(argv[2], int(argv[3]), int(argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
