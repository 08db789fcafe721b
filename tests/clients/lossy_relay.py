"""A relay that loses the first copy of every request, in one of four ways, to show that a
client resends it.

Usage: python lossy_relay.py NATS_URL PREFIX TARGET

Stands between a client and the workers: the client sends on `PREFIX.<how>`, the workers listen
on TARGET. The first copy of each `Embatch-Request-Id` is lost as `<how>` says:
- `drop`: dropped, as nats-server may drop a message routed to a worker around its unsubscribe
  (docs/nats-contract.md, "Delivery guarantees");
- `silent`: acknowledged (`Embatch-Accepted-By: lossy-relay`, `Embatch-Worker-Connects: 1`) by
  a worker that is then killed: no heartbeat, no reply;
- `reconnect`: acknowledged so, then beaten for every 100 ms on the request's
  `Embatch-Heartbeat-To` (or `PREFIX.reconnect.alive`) with `Embatch-Worker-Connects: 2`, by a
  worker that reconnected to another server and lost its reply with the old one: it never falls
  silent (it beats until the id is withdrawn, for 10 s at most), so only that count tells;
- `unhealthy`: answered 503 `Unhealthy` (`Nats-Service-Error-Code: 503`) by a worker whose
  upstream died.
Every later copy goes on to TARGET as it came (payload, headers, reply subject), so the worker
that takes it acknowledges and answers the client directly. Withdrawals on `PREFIX.<how>.cancel`
go on to `TARGET.cancel`. scripts/client-tests.sh runs the resend examples through it.

Prints one line per event, flushed, until it is killed:
    ready
    drop|silent|reconnect|unhealthy <request id> attempt 1
    forwarded <request id> attempt <N>
    cancel <request id>
"""

import asyncio
import json
import signal
import sys

import nats

WORKER_ID = "lossy-relay"
BEAT_S, BEAT_FOR_S = 0.1, 10.0


async def main() -> None:
    url, prefix, target = sys.argv[1:4]
    nc = await nats.connect(url)
    seen: set[str] = set()
    beating: dict[str, asyncio.Task] = {}

    async def beat(subject: str) -> None:
        for _ in range(int(BEAT_FOR_S / BEAT_S)):
            await asyncio.sleep(BEAT_S)
            await nc.publish(subject, WORKER_ID.encode(), headers={"Embatch-Worker-Connects": "2"})

    async def lose(msg, how: str, request_id: str) -> None:
        if how == "drop":
            return
        if how == "unhealthy":
            error = {"error": "the upstream is unreachable", "error_type": "Unhealthy"}
            headers = {"Nats-Service-Error-Code": "503", "Nats-Service-Error": error["error"]}
            await nc.publish(msg.reply, json.dumps(error).encode(), headers=headers)
            return
        ack = {"Embatch-Accepted-By": WORKER_ID, "Embatch-Worker-Connects": "1"}
        await nc.publish(msg.reply, b"", headers=ack)
        if how == "reconnect":
            beats = (msg.headers or {}).get("Embatch-Heartbeat-To", f"{msg.subject}.alive")
            beating[request_id] = asyncio.create_task(beat(beats))

    async def on_request(msg) -> None:
        how = msg.subject.rsplit(".", 1)[-1]
        headers = msg.headers or {}
        request_id = headers.get("Embatch-Request-Id", "")
        attempt = headers.get("Embatch-Attempt", "1")
        if request_id not in seen:
            seen.add(request_id)
            await lose(msg, how, request_id)
            print(f"{how} {request_id} attempt {attempt}", flush=True)
            return
        await nc.publish(target, msg.data, reply=msg.reply, headers=msg.headers)
        print(f"forwarded {request_id} attempt {attempt}", flush=True)

    async def on_cancel(msg) -> None:
        request_id = msg.data.decode()
        if task := beating.pop(request_id, None):
            task.cancel()
        await nc.publish(f"{target}.cancel", msg.data)
        print(f"cancel {request_id}", flush=True)

    for how in ("drop", "silent", "reconnect", "unhealthy"):
        await nc.subscribe(f"{prefix}.{how}", cb=on_request)
        await nc.subscribe(f"{prefix}.{how}.cancel", cb=on_cancel)
    await nc.flush()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in beating.values():
        task.cancel()
    try:  # never hold up the script's exit, which waits for this process
        await asyncio.wait_for(nc.close(), 2)
    except (asyncio.TimeoutError, nats.errors.Error):
        pass


if __name__ == "__main__":
    asyncio.run(main())
