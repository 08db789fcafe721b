"""A direct embatch request over NATS with the official Python client (nats-py), no gateway.

Usage: python3 examples/direct_nats.py [NATS_URL] [text ...]
Environment: EMBATCH_SUBJECT (default `embed`). Exit status: 0 embedded, 1 error reply or
timeout, 3 no worker listening (no responders).

The contract (docs/nats-contract.md): request-reply on subject `embed`; the payload is TEI's
POST /embed JSON body; the header `Embatch-Deadline-Ms` carries the time budget in ms. A success
reply is a JSON array of float arrays; an error reply carries `Nats-Service-Error-Code` (HTTP-style
status) and `Nats-Service-Error` headers with TEI's error JSON body.
"""

import asyncio
import json
import os
import sys

import nats
from nats.errors import NoRespondersError, TimeoutError


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222"
    texts = sys.argv[2:] or ["Direct NATS requests skip the gateway.", "Any language with a NATS client works."]
    subject = os.environ.get("EMBATCH_SUBJECT", "embed")
    nc = await nats.connect(url)
    try:
        reply = await nc.request(
            subject,
            json.dumps({"inputs": texts, "normalize": True}).encode(),
            timeout=10,
            headers={"Embatch-Deadline-Ms": "10000", "Embatch-Version": "1"},
        )
    except NoRespondersError:
        print(f"no embatch worker is listening on `{subject}` (503)", file=sys.stderr)
        return 3
    except TimeoutError:
        print("no reply within 10 s (504)", file=sys.stderr)
        return 1
    finally:
        await nc.close()

    code = (reply.headers or {}).get("Nats-Service-Error-Code")
    if code:
        error = json.loads(reply.data)
        print(f"error {code} {error['error_type']}: {error['error']}", file=sys.stderr)
        return 1
    embeddings = json.loads(reply.data)
    for text, vector in zip(texts, embeddings):
        head = ", ".join(f"{x:+.4f}" for x in vector[:4])
        print(f"[nats] {len(vector)} dims  [{head}, ...]  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
