"""A direct embatch request over NATS (nats-py) with the full recovery guarantee: acknowledgement,
heartbeat and resend, as docs/nats-contract.md ("Acknowledgement and resend") states them. A plain
`nc.request` is lost when nats-server drops the message or the worker holding it dies; this one
is resent.

Usage: python3 examples/direct_nats_resend.py [NATS_URL] [text ...]
Environment: EMBATCH_SUBJECT (default `embed`). Exit status: 0 embedded, 1 error reply or no
reply within the 10 s deadline, 3 no worker listening (no responders for 150 ms).

How: the request asks for an acknowledgement (`Embatch-Ack: 1`), carries an `Embatch-Request-Id`
and names a heartbeat subject of this client's own (`Embatch-Heartbeat-To`). A worker that still
holds it 20 ms after reading it sends an empty message with `Embatch-Accepted-By` (its id) on the
reply subject, then beats on the heartbeat subject every 100 ms while it holds it; the reply
follows on the reply subject. The request is resent (same id, `Embatch-Attempt` set to the
copy's number, the deadline that is left) when:
- neither an acknowledgement nor the reply came within 120 ms (doubling at each resend): nobody
  has it;
- the worker that acknowledged it has not been heard for 500 ms: it died;
- that worker beats with a larger `Embatch-Worker-Connects` than its acknowledgement carried: it
  reconnected to NATS, and a reply sent before may be lost;
- a worker answered 503 (its upstream died, or it is stopping).
Beats on `<subject>.alive` count too (workers before contract 1.6 beat there). After a resend,
the id goes to `<subject>.cancel` once the reply is in, so a worker still holding another copy
drops it. "No responders" (no worker in the queue group: they leave it while full and
re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract says.
examples/go/resend and examples/node/resend.mjs are the same program in Go and Node.
"""

import asyncio
import json
import os
import sys
import time

import nats

DEADLINE_S = 10.0
FIRST_WAIT_S = 0.12  # the workers' 20 ms acknowledgement delay + a margin
SILENCE_S = 0.5  # an acknowledging worker not heard for this long has died
NO_RESPONDERS_RETRIES = 4  # after 10, 20, 40, 80 ms
ACCEPTED_BY, CONNECTS = "Embatch-Accepted-By", "Embatch-Worker-Connects"


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "nats://127.0.0.1:4222"
    texts = sys.argv[2:] or ["Direct NATS requests skip the gateway.", "Any language with a NATS client works."]
    subject = os.environ.get("EMBATCH_SUBJECT", "embed")
    body = json.dumps({"inputs": texts, "normalize": True}).encode()
    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        beats = f"{inbox}.alive"
        # Replies, our own heartbeats and the shared ones, in arrival order.
        mailbox: asyncio.Queue = asyncio.Queue()
        for s in (inbox, beats, f"{subject}.alive"):
            await nc.subscribe(s, cb=mailbox.put)
        due = time.monotonic() + DEADLINE_S
        wait, attempt, no_responders, reply = FIRST_WAIT_S, 0, 0, None
        resend = True
        while reply is None and time.monotonic() < due:
            if resend:
                attempt, resend = attempt + 1, False
                sent, acked, connects, heard = time.monotonic(), None, None, 0.0
                headers = {"Embatch-Ack": "1", "Embatch-Request-Id": inbox, "Embatch-Heartbeat-To": beats,
                           "Embatch-Deadline-Ms": str(int((due - sent) * 1000)), "Embatch-Version": "1"}
                if attempt > 1:
                    headers["Embatch-Attempt"] = str(attempt)
                await nc.publish(subject, body, reply=inbox, headers=headers)
            # Until when to wait: the acknowledgement, or the next word from the worker holding it.
            until = heard + SILENCE_S if acked else sent + wait
            try:
                msg = await asyncio.wait_for(mailbox.get(), max(0.0, min(until, due) - time.monotonic()))
            except asyncio.TimeoutError:
                if not acked:
                    wait *= 2  # nobody has it
                resend = True  # or its worker died
                continue
            h = msg.headers or {}
            if msg.subject != inbox:  # a heartbeat: the body is the worker's id
                if acked and msg.data.decode() == acked:
                    heard = time.monotonic()
                    resend = connects is not None and int(h.get(CONNECTS, "0")) > connects
                continue
            if ACCEPTED_BY in h:  # held: now wait for the reply, as long as its worker lives
                acked, heard = h[ACCEPTED_BY], time.monotonic()
                connects = int(h[CONNECTS]) if CONNECTS in h else None
            elif h.get("Status") == "503" and not msg.data:  # no responders
                if no_responders == NO_RESPONDERS_RETRIES:
                    print(f"no embatch worker is listening on `{subject}` (503)", file=sys.stderr)
                    return 3
                await asyncio.sleep(0.01 * 2**no_responders)
                no_responders, resend = no_responders + 1, True
            elif h.get("Nats-Service-Error-Code") == "503" and time.monotonic() + wait < due:
                await asyncio.sleep(wait)  # that worker cannot serve it: another may
                resend = True
            else:
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
