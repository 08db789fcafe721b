// A direct embatch request over NATS (`nats` on npm) with the full recovery guarantee:
// acknowledgement and resend, as docs/design/recovery.md describes them ("The full guarantee from
// another language"). A plain nc.request is lost when nats-server drops the message or the worker
// holding it dies; this one is resent. The same program as examples/direct_nats_resend.py.
//
// Usage: node resend.mjs [NATS_URL] [text ...]          (npm ci first)
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or no reply within the 10 s deadline, 3 no worker
// listening (no responders for 150 ms).
//
// How: the request asks for an acknowledgement (Embatch-Ack: 1) and carries an
// Embatch-Request-Id. A worker that still holds it 20 ms after reading it sends an empty message
// with Embatch-Accepted-By on the reply subject; the reply follows on the same subject. When
// neither comes within 120 ms (doubling at each resend), nobody has the request: it is resent,
// the same id and Embatch-Attempt set to the copy's number, with the deadline that is left. After
// a resend, the id goes to <subject>.cancel once the reply is in, so a worker still holding
// another copy drops it. "No responders" (no worker in the queue group: they leave it while full
// and re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract
// says. (Following the acknowledging worker's heartbeat on <subject>.alive, to resend when it
// dies, is left out here.)
import { connect, createInbox, headers } from "nats";

const DEADLINE_MS = 10000;
const FIRST_WAIT_MS = 120; // the workers' 20 ms acknowledgement delay + a margin
const NO_RESPONDERS_RETRIES = 4; // after 10, 20, 40, 80 ms

const url = process.argv[2] ?? "nats://127.0.0.1:4222";
const texts = process.argv.length > 3
  ? process.argv.slice(3)
  : ["Direct NATS requests skip the gateway.", "Any language with a NATS client works."];
const subject = process.env.EMBATCH_SUBJECT || "embed";

async function main() {
  const nc = await connect({ servers: url });
  let reply = null;
  try {
    const inbox = createInbox();
    const messages = nc.subscribe(inbox)[Symbol.asyncIterator]();
    // One read in flight at a time: a read that lost the race against the timer still yields
    // the next message, so it is kept for the next call instead of started again.
    let pending = messages.next();
    const next = async (ms) => {
      let timer;
      const expired = new Promise((resolve) => { timer = setTimeout(() => resolve(null), ms); });
      const r = await Promise.race([pending, expired]);
      clearTimeout(timer);
      if (r === null || r.done) return null;
      pending = messages.next();
      return r.value;
    };

    const payload = new TextEncoder().encode(JSON.stringify({ inputs: texts, normalize: true }));
    const due = performance.now() + DEADLINE_MS;
    let wait = FIRST_WAIT_MS;
    let attempt = 1;
    let noResponders = 0;
    while (reply === null && performance.now() < due) {
      const h = headers();
      h.set("Embatch-Ack", "1");
      h.set("Embatch-Request-Id", inbox);
      h.set("Embatch-Deadline-Ms", String(Math.floor(due - performance.now())));
      h.set("Embatch-Version", "1");
      if (attempt > 1) h.set("Embatch-Attempt", String(attempt));
      nc.publish(subject, payload, { reply: inbox, headers: h });
      let msg = await next(Math.min(wait, due - performance.now()));
      while (msg?.headers?.get("Embatch-Accepted-By")) { // held: wait for the reply
        msg = await next(Math.max(1, due - performance.now()));
      }
      if (msg === null) {
        attempt += 1; // nobody has it: resend
        wait *= 2;
      } else if (msg.headers?.code === 503 && msg.data.length === 0) { // no responders
        if (noResponders === NO_RESPONDERS_RETRIES) {
          console.error(`no embatch worker is listening on \`${subject}\` (503)`);
          return 3;
        }
        await new Promise((resolve) => setTimeout(resolve, 10 * 2 ** noResponders));
        attempt += 1;
        noResponders += 1;
      } else {
        reply = msg;
      }
    }
    if (attempt > 1 && reply !== null) {
      nc.publish(`${subject}.cancel`, new TextEncoder().encode(inbox));
      await nc.flush();
    }
  } finally {
    await nc.close();
  }

  if (reply === null) {
    console.error(`no reply within ${DEADLINE_MS / 1000} s (504)`);
    return 1;
  }
  const code = reply.headers?.get("Nats-Service-Error-Code");
  if (code) {
    const error = JSON.parse(new TextDecoder().decode(reply.data));
    console.error(`error ${code} ${error.error_type}: ${error.error}`);
    return 1;
  }
  const embeddings = JSON.parse(new TextDecoder().decode(reply.data));
  if (!Array.isArray(embeddings) || embeddings.length !== texts.length) {
    console.error(`expected ${texts.length} vectors, got ${JSON.stringify(embeddings).slice(0, 200)}`);
    return 1;
  }
  embeddings.forEach((vector, i) => {
    const head = vector.slice(0, 4).map((x) => (x >= 0 ? "+" : "") + x.toFixed(4)).join(", ");
    console.log(`[nats] ${vector.length} dims  [${head}, ...]  ${texts[i]}`);
  });
  return 0;
}

process.exitCode = await main();
