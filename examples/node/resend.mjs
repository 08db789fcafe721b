// A direct embatch request over NATS (`nats` on npm) with the full recovery guarantee:
// acknowledgement, heartbeat and resend, as docs/nats-contract.md ("Acknowledgement and resend")
// states them. A plain nc.request is lost when nats-server drops the message or the worker
// holding it dies; this one is resent. The same program as examples/direct_nats_resend.py.
//
// Usage: node resend.mjs [NATS_URL] [text ...]          (npm ci first)
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or no reply within the 10 s deadline, 3 no worker
// listening (no responders for 150 ms).
//
// How: the request asks for an acknowledgement (Embatch-Ack: 1), carries an Embatch-Request-Id
// and names a heartbeat subject of this client's own (Embatch-Heartbeat-To). A worker that still
// holds it 20 ms after reading it sends an empty message with Embatch-Accepted-By (its id) on the
// reply subject, then beats on the heartbeat subject every 100 ms while it holds it; the reply
// follows on the reply subject. The request is resent (same id, Embatch-Attempt set to the copy's
// number, the deadline that is left) when:
//   - neither an acknowledgement nor the reply came within 120 ms (doubling at each resend):
//     nobody has it;
//   - the worker that acknowledged it has not been heard for 500 ms: it died;
//   - that worker beats with a larger Embatch-Worker-Connects than its acknowledgement carried:
//     it reconnected to NATS, and a reply sent before may be lost;
//   - a worker answered 503 (its upstream died, or it is stopping).
// Beats on <subject>.alive count too (workers before contract 1.6 beat there). After a resend,
// the id goes to <subject>.cancel once the reply is in, so a worker still holding another copy
// drops it. "No responders" (no worker in the queue group: they leave it while full and
// re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract says.
import { connect, createInbox, headers } from "nats";

const DEADLINE_MS = 10000;
const FIRST_WAIT_MS = 120; // the workers' 20 ms acknowledgement delay + a margin
const SILENCE_MS = 500; // an acknowledging worker not heard for this long has died
const NO_RESPONDERS_RETRIES = 4; // after 10, 20, 40, 80 ms
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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
    const beats = `${inbox}.alive`;
    // Replies, our own heartbeats and the shared ones, in arrival order.
    const mailbox = [];
    let wake = () => {};
    for (const s of [inbox, beats, `${subject}.alive`]) {
      nc.subscribe(s, { callback: (_, m) => { mailbox.push(m); wake(); } });
    }
    const next = async (ms) => {
      if (mailbox.length === 0) {
        let timer;
        await new Promise((resolve) => { wake = resolve; timer = setTimeout(resolve, ms); });
        clearTimeout(timer);
      }
      return mailbox.shift() ?? null;
    };

    const payload = new TextEncoder().encode(JSON.stringify({ inputs: texts, normalize: true }));
    const due = performance.now() + DEADLINE_MS;
    let wait = FIRST_WAIT_MS;
    let attempt = 0;
    let noResponders = 0;
    let resend = true;
    let sent = 0;
    let heard = 0;
    let acked = null;
    let connects = null; // the acknowledgement's Embatch-Worker-Connects; null: none (an older worker)
    while (reply === null && performance.now() < due) {
      if (resend) {
        attempt += 1;
        resend = false;
        acked = null;
        sent = performance.now();
        const h = headers();
        h.set("Embatch-Ack", "1");
        h.set("Embatch-Request-Id", inbox);
        h.set("Embatch-Heartbeat-To", beats);
        h.set("Embatch-Deadline-Ms", String(Math.floor(due - sent)));
        h.set("Embatch-Version", "1");
        if (attempt > 1) h.set("Embatch-Attempt", String(attempt));
        nc.publish(subject, payload, { reply: inbox, headers: h });
      }
      // Until when to wait: the acknowledgement, or the next word from the worker holding it.
      const until = acked !== null ? heard + SILENCE_MS : sent + wait;
      const msg = await next(Math.max(0, Math.min(until, due) - performance.now()));
      if (msg === null) { // nobody has it, or its worker died
        if (acked === null) wait *= 2;
        resend = true;
      } else if (msg.subject !== inbox) { // a heartbeat: the body is the worker's id
        if (acked !== null && new TextDecoder().decode(msg.data) === acked) {
          heard = performance.now();
          resend = connects !== null && Number(msg.headers?.get("Embatch-Worker-Connects")) > connects;
        }
      } else if (msg.headers?.get("Embatch-Accepted-By")) { // held: wait for the reply while its worker lives
        acked = msg.headers.get("Embatch-Accepted-By");
        heard = performance.now();
        const n = msg.headers.get("Embatch-Worker-Connects");
        connects = n ? Number(n) : null;
      } else if (msg.headers?.code === 503 && msg.data.length === 0) { // no responders
        if (noResponders === NO_RESPONDERS_RETRIES) {
          console.error(`no embatch worker is listening on \`${subject}\` (503)`);
          return 3;
        }
        await sleep(10 * 2 ** noResponders);
        noResponders += 1;
        resend = true;
      } else if (msg.headers?.get("Nats-Service-Error-Code") === "503" && performance.now() + wait < due) {
        await sleep(wait); // that worker cannot serve it: another may
        resend = true;
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
