"""A relay that loses the first copy of every request, to show that a client resends it.

Usage: python drop_first_copy.py NATS_URL SUBJECT TARGET

Stands between a client and the workers: the client sends on SUBJECT, the workers listen on
TARGET. The first copy of each `Embatch-Request-Id` is dropped, as nats-server may drop a
message routed to a worker around its unsubscribe (docs/nats-contract.md, "Delivery
guarantees"); every later copy goes on to TARGET as it came (payload, headers, reply subject),
so the worker that takes it acknowledges and answers the client directly. Withdrawals on
`SUBJECT.cancel` go on to `TARGET.cancel`. scripts/client-tests.sh runs the resend examples
through it.

Prints one line per event, flushed, until it is killed:
    ready
    dropped <request id> attempt 1
    forwarded <request id> attempt <N>
    cancel <request id>
"""

import asyncio
import signal
import sys

import nats


async def main() -> None:
    url, subject, target = sys.argv[1:4]
    nc = await nats.connect(url)
    seen: set[str] = set()

    async def on_request(msg) -> None:
        headers = msg.headers or {}
        request_id = headers.get("Embatch-Request-Id", "")
        attempt = headers.get("Embatch-Attempt", "1")
        if request_id not in seen:
            seen.add(request_id)
            print(f"dropped {request_id} attempt {attempt}", flush=True)
            return
        await nc.publish(target, msg.data, reply=msg.reply, headers=msg.headers)
        print(f"forwarded {request_id} attempt {attempt}", flush=True)

    async def on_cancel(msg) -> None:
        await nc.publish(f"{target}.cancel", msg.data)
        print(f"cancel {msg.data.decode()}", flush=True)

    await nc.subscribe(subject, cb=on_request)
    await nc.subscribe(f"{subject}.cancel", cb=on_cancel)
    await nc.flush()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
