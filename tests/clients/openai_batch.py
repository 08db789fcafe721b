"""A bulk embedding job through the unmodified `openai` SDK, end to end, checked against the
interactive path.

files.create(purpose="batch") -> batches.create(endpoint="/v1/embeddings",
completion_window="24h") -> batches.retrieve until a final status -> files.content; then every
custom_id must appear exactly once, with no error, and each vector must equal (cosine >= 0.9999)
what `POST /v1/embeddings` answers for the same input.

Used by tests/clients/test_clients.py (a small job, in scripts/client-tests.sh) and by the
benchmark (`python3 loadtest/bench.py --only bulk_sdk`, a 10,000-input job on the built-in model):

    python openai_batch.py GATEWAY_URL N_INPUTS [TIMEOUT_S]

prints one JSON object (inputs, timings, min cosine, duplicates, missing) and exits 1 when a check
fails (the message on stderr).
"""

import json
import math
import sys
import time
import urllib.request
from collections import Counter

MIN_COSINE = 0.9999
FINAL = {"completed", "failed", "expired", "cancelled"}
# Inputs per interactive /v1/embeddings call made for the comparison (below
# MAX_CLIENT_BATCH_SIZE, 512 by default).
INTERACTIVE_CHUNK = 256

WORDS = ("vector search embeds documents queries into a shared space where nearby points mean "
         "similar text the gateway batches requests from many callers workers pull bulk items "
         "when interactive traffic leaves room a corpus of news articles product reviews code "
         "comments and support tickets is indexed overnight").split()


def synthetic_texts(n: int, offset: int = 0) -> list[str]:
    """n distinct, deterministic sentences of 8-40 words."""
    out = []
    for i in range(offset, offset + n):
        length = 8 + (i * 7919) % 33
        words = [WORDS[(i * 31 + k * 17 + (i >> 3)) % len(WORDS)] for k in range(length)]
        out.append(f"Document {i}: " + " ".join(words) + ".")
    return out


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def served_model(gateway: str) -> str:
    """`model_id` of the gateway's GET /info: a batch line must name the served model."""
    with urllib.request.urlopen(gateway + "/info", timeout=10) as r:
        return json.load(r)["model_id"]


def run(gateway: str, texts: list[str], timeout_s: float = 120.0, poll_s: float = 0.5) -> dict:
    """Runs the job and checks it; returns the figures. Raises AssertionError naming what is
    wrong."""
    from openai import OpenAI

    client = OpenAI(base_url=gateway + "/v1", api_key="unused", timeout=120)
    model = served_model(gateway)
    ids = [f"req-{i}" for i in range(len(texts))]
    jsonl = "".join(
        json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": model, "input": text, "encoding_format": "float"}}) + "\n"
        for cid, text in zip(ids, texts))

    started = time.monotonic()
    uploaded = client.files.create(file=("openai-sdk-batch.jsonl", jsonl.encode()),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                  completion_window="24h",
                                  metadata={"check": "tests/clients/openai_batch.py"})
    submitted = time.monotonic()
    while batch.status not in FINAL:
        assert time.monotonic() - started < timeout_s, (
            f"batch {batch.id} still {batch.status} after {timeout_s:g} s "
            f"({batch.request_counts})")
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch.id)
    finished = time.monotonic()
    assert batch.status == "completed", f"batch {batch.id} ended {batch.status}: {batch.errors}"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (len(texts), len(texts), 0), (
        f"request_counts {counts}, want total = completed = {len(texts)}, failed = 0")
    assert batch.output_file_id, "a completed batch without output_file_id"
    content = client.files.content(batch.output_file_id).content.decode()
    downloaded = time.monotonic()

    lines = [json.loads(line) for line in content.splitlines() if line.strip()]
    seen = Counter(line["custom_id"] for line in lines)
    duplicated = sorted(cid for cid, n in seen.items() if n > 1)
    missing = sorted(set(ids) - seen.keys())
    unknown = sorted(seen.keys() - set(ids))
    assert not (duplicated or missing or unknown), (
        f"custom_ids: {len(duplicated)} duplicated (e.g. {duplicated[:3]}), {len(missing)} "
        f"missing (e.g. {missing[:3]}), {len(unknown)} unknown (e.g. {unknown[:3]})")
    vectors = {}
    for line in lines:
        response = line.get("response") or {}
        assert line.get("error") is None and response.get("status_code") == 200, (
            f"{line['custom_id']}: error {line.get('error')}, status {response.get('status_code')}")
        data = response["body"]["data"]
        assert len(data) == 1, f"{line['custom_id']}: {len(data)} embeddings for one input"
        vectors[line["custom_id"]] = data[0]["embedding"]

    # The interactive path, for the same inputs.
    worst, dims = 1.0, None
    for start in range(0, len(texts), INTERACTIVE_CHUNK):
        chunk = texts[start:start + INTERACTIVE_CHUNK]
        answer = client.embeddings.create(model=model, input=chunk, encoding_format="float")
        for i, item in enumerate(answer.data):
            cid = ids[start + i]
            got = vectors[cid]
            dims = len(got)
            assert len(item.embedding) == dims, f"{cid}: {dims} dims in bulk, " \
                                                f"{len(item.embedding)} interactive"
            c = cosine(got, item.embedding)
            assert c >= MIN_COSINE, f"{cid}: cosine {c:.6f} < {MIN_COSINE} against " \
                                    f"/v1/embeddings for {texts[start + i]!r}"
            worst = min(worst, c)
    return {"inputs": len(texts), "batch_id": batch.id, "dims": dims, "min_cosine": worst,
            "duplicated": len(duplicated), "missing": len(missing),
            "submit_s": submitted - started, "batch_s": finished - submitted,
            "download_s": downloaded - finished,
            "inputs_per_s": len(texts) / (finished - submitted),
            "vectors": [vectors[cid] for cid in ids]}


def main() -> int:
    gateway, n = sys.argv[1].rstrip("/"), int(sys.argv[2])
    timeout_s = float(sys.argv[3]) if len(sys.argv) > 3 else 3600.0
    try:
        result = run(gateway, synthetic_texts(n), timeout_s=timeout_s, poll_s=1.0)
    except AssertionError as error:
        print(f"openai_batch: {error}", file=sys.stderr)
        return 1
    del result["vectors"]
    from importlib.metadata import version
    result["openai"] = version("openai")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
