#!/usr/bin/env python3
"""A bulk job through a running gateway (OpenAI's Files + Batches API), with a fault injected
mid-job: uploads N one-input `/v1/embeddings` lines, creates the batch, runs FAULT (a shell
command, e.g. `docker kill <worker container>`) once the batch has completed at least a tenth of
its lines, and follows the batch to its end. Passes when the batch is `completed`, its output
file holds every `custom_id` exactly once with status 200 and a vector, and nothing went to the
error file. Standard library only (urllib), so it runs wherever python3 does.

Usage: bulk_job.py GATEWAY_URL N FAULT [TIMEOUT_S]
Prints one JSON line (batch id, status, counts, seconds, when the fault ran); exits 1 on failure.
"""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid


def call(method: str, url: str, body: bytes | None = None, content_type: str | None = None):
    request = urllib.request.Request(url, data=body, method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def upload(gateway: str, name: str, content: bytes) -> dict:
    """POST /v1/files as multipart/form-data with purpose=batch."""
    boundary = uuid.uuid4().hex
    parts = [
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n".encode(),
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
        "Content-Type: application/jsonl\r\n\r\n".encode() + content + b"\r\n",
        f"--{boundary}--\r\n".encode(),
    ]
    return json.loads(call("POST", f"{gateway}/v1/files", b"".join(parts),
                           f"multipart/form-data; boundary={boundary}"))


def main() -> int:
    gateway, n, fault = sys.argv[1].rstrip("/"), int(sys.argv[2]), sys.argv[3]
    timeout_s = float(sys.argv[4]) if len(sys.argv) > 4 else 240.0
    model = json.loads(call("GET", f"{gateway}/info")).get("model_id", "default")
    lines = [json.dumps({"custom_id": f"e2e-{i}", "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": model, "input": f"bulk check line {i}: a short text"}})
             for i in range(n)]
    file = upload(gateway, "e2e-bulk.jsonl", ("\n".join(lines) + "\n").encode())
    batch = json.loads(call("POST", f"{gateway}/v1/batches", json.dumps({
        "input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": "24h",
    }).encode(), "application/json"))
    started = time.monotonic()
    fault_at = None
    final = {"completed", "failed", "expired", "cancelled"}
    while batch["status"] not in final and time.monotonic() - started < timeout_s:
        time.sleep(0.5)
        try:
            batch = json.loads(call("GET", f"{gateway}/v1/batches/{batch['id']}"))
        except (urllib.error.URLError, TimeoutError) as err:
            print(f"poll: {err}", file=sys.stderr)
            continue
        done = (batch.get("request_counts") or {}).get("completed", 0)
        if fault_at is None and done >= n // 10:
            fault_at = {"completed": done, "s": round(time.monotonic() - started, 1)}
            subprocess.run(fault, shell=True, check=False)
    result = {"batch": batch["id"], "status": batch["status"],
              "request_counts": batch.get("request_counts"),
              "s": round(time.monotonic() - started, 1), "fault_at": fault_at}
    ok = batch["status"] == "completed" and fault_at is not None
    if batch["status"] == "completed":
        output = call("GET", f"{gateway}/v1/files/{batch['output_file_id']}/content").decode()
        seen: dict[str, int] = {}
        good = 0
        for line in output.splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            seen[entry["custom_id"]] = seen.get(entry["custom_id"], 0) + 1
            response = entry.get("response") or {}
            data = (response.get("body") or {}).get("data") or []
            good += response.get("status_code") == 200 and len(data) == 1 \
                and len(data[0].get("embedding") or []) > 0
        result["missing"] = sum(1 for i in range(n) if f"e2e-{i}" not in seen)
        result["duplicated"] = sum(1 for count in seen.values() if count > 1)
        result["answered_200"] = good
        result["error_file_id"] = batch.get("error_file_id")
        ok = ok and result["missing"] == 0 and result["duplicated"] == 0 and good == n \
            and not batch.get("error_file_id")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
