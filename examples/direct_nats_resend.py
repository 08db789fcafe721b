"""A direct embatch request over NATS (nats-py) with the full recovery guarantee: acknowledgement
and resend, as docs/design/recovery.md describes them ("The full guarantee from another
language"). A plain `nc.request` is lost when nats-server drops the message or the worker
holding it dies; this one is resent.

Usage: python3 examples/direct_nats_resend.py [NATS_URL] [text ...]
Environment: EMBATCH_SUBJECT (default `embed`). Exit status: 0 embedded, 1 error reply or no
reply within the 10 s deadline, 3 no worker listening (no responders for 150 ms).

How: the request asks for an acknowledgement (`Embatch-Ack: 1`) and carries an
`Embatch-Request-Id`. A worker that still holds it 20 ms after reading it sends an empty message
with `Embatch-Accepted-By` on the reply subject; the reply follows on the same subject. When
neither comes within 120 ms (doubling at each resend), nobody has the request: it is resent, the
same id and `Embatch-Attempt` set to the copy's number, with the deadline that is left. After a
resend, the id goes to `<subject>.cancel` once the reply is in, so a worker still holding another
copy drops it. "No responders" (no worker in the queue group: they leave it while full and
re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract says.
(Following the acknowledging worker's heartbeat on `<subject>.alive`, to resend when it dies, is
left out here.) examples/go/resend and examples/node/resend.mjs are the same program in Go and Node.
"""

import asyncio
import json
import os
import sys
import time

import nats
from nats.errors import TimeoutError

DEADLINE_S = 10.0
FIRST_WAIT_S = 0.12  # the workers' 20 ms acknowledgement delay + a margin
NO_RESPONDERS_RETRIES = 4  # after 10, 20, 40, 80 ms


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222"
    texts = sys.argv[2:] or ["Direct NATS requests skip the gateway.", "Any language with a NATS client works."]
    subject = os.environ.get("EMBATCH_SUBJECT", "embed")
    body = json.dumps({"inputs": texts, "normalize": True}).encode()
    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        due = time.monotonic() + DEADLINE_S
        wait, attempt, no_responders, reply = FIRST_WAIT_S, 1, 0, None
        while reply is None and time.monotonic() < due:
            left_ms = int((due - time.monotonic()) * 1000)
            headers = {"Embatch-Ack": "1", "Embatch-Request-Id": inbox,
                       "Embatch-Deadline-Ms": str(left_ms), "Embatch-Version": "1"}
            if attempt > 1:
                headers["Embatch-Attempt"] = str(attempt)
            await nc.publish(subject, body, reply=inbox, headers=headers)
            try:
                msg = await sub.next_msg(timeout=min(wait, due - time.monotonic()))
                while "Embatch-Accepted-By" in (msg.headers or {}):  # held: wait for the reply
                    msg = await sub.next_msg(timeout=max(0.001, due - time.monotonic()))
            except TimeoutError:
                attempt, wait = attempt + 1, wait * 2  # nobody has it: resend
                continue
            if (msg.headers or {}).get("Status") == "503" and not msg.data:  # no responders
                if no_responders == NO_RESPONDERS_RETRIES:
                    print(f"no embatch worker is listening on `{subject}` (503)", file=sys.stderr)
                    return 3
                await asyncio.sleep(0.01 * 2**no_responders)
                attempt, no_responders = attempt + 1, no_responders + 1
                continue
            reply = msg
        if attempt > 1 and reply is not None:
            await nc.publish(f"{subject}.cancel", inbox.encode())
    finally:
        await nc.close()

    if reply is None:
        print(f"no reply within {DEADLINE_S:g} s (504)", file=sys.stderr)
        return 1
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
