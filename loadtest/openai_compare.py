"""Vectors through a worker on an OpenAI-compatible upstream against the built-in model's.

Sends 40 distinct texts at once, one request each, to the gateway in front of the OPENAI_URL
worker (port argv[1]) and to the one in front of the built-in model (argv[2]), and prints the
largest difference; then one request of 5, `dimensions` and `normalize: false` (see
loadtest/openai_litellm.sh). Python 3 stdlib only.
"""
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor

texts = [f"sentence number {i} about {w}" for i, w in enumerate(
    "cats dogs rivers GPUs batching queues tokens NATS proxies vectors".split() * 4)]

OPENAI_PORT, BUILTIN_PORT = (int(p) for p in sys.argv[1:3])


def embed(port, text, extra=None):
    body = {"inputs": text, **(extra or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/embed", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)

with ThreadPoolExecutor(len(texts)) as pool:
    via_openai = list(pool.map(lambda t: embed(OPENAI_PORT, t), texts))
    builtin = list(pool.map(lambda t: embed(BUILTIN_PORT, t), texts))
worst = 0.0
for (sa, a), (sb, b) in zip(via_openai, builtin):
    assert sa == 200 and sb == 200, (sa, a, sb, b)
    assert len(a[0]) == len(b[0]) == 384
    worst = max(worst, max(abs(x - y) for x, y in zip(a[0], b[0])))
print(f"{len(texts)} texts, concurrent: max |diff| = {worst:.3g}")
batch = embed(OPENAI_PORT, texts[:5])
print("one request of 5:", batch[0], "equal:", batch[1] == [v[1][0] for v in builtin[:5]])
print("dimensions 64:", embed(OPENAI_PORT, "short", {"dimensions": 64})[0])
print("normalize false:", embed(OPENAI_PORT, "x", {"normalize": False}))
