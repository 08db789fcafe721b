// A direct embatch request over NATS with the official Node client (`nats` on npm), no gateway.
//
// Usage: node index.mjs [NATS_URL] [text ...]          (npm ci first)
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or timeout, 3 no worker listening (no responders).
//
// The contract (docs/nats-contract.md): request-reply on subject "embed"; the payload is TEI's
// POST /embed JSON body; the header Embatch-Deadline-Ms carries the time budget in ms. A success
// reply is a JSON array of float arrays; an error reply carries the Nats-Service-Error-Code
// (HTTP-style status) and Nats-Service-Error headers with TEI's error JSON body.
import { connect, ErrorCode, headers } from "nats";

const url = process.argv[2] ?? "nats://127.0.0.1:4222";
const texts = process.argv.length > 3
  ? process.argv.slice(3)
  : ["Direct NATS requests skip the gateway.", "Any language with a NATS client works."];
const subject = process.env.EMBATCH_SUBJECT || "embed";

async function main() {
  const nc = await connect({ servers: url });
  try {
    const h = headers();
    h.set("Embatch-Deadline-Ms", "10000");
    h.set("Embatch-Version", "1");
    const payload = new TextEncoder().encode(JSON.stringify({ inputs: texts, normalize: true }));
    let msg;
    try {
      msg = await nc.request(subject, payload, { timeout: 10000, headers: h });
    } catch (err) {
      if (err.code === ErrorCode.NoResponders) {
        console.error(`no embatch worker is listening on \`${subject}\` (503)`);
        return 3;
      }
      if (err.code === ErrorCode.Timeout) {
        console.error("no reply within 10 s (504)");
        return 1;
      }
      throw err;
    }

    const code = msg.headers?.get("Nats-Service-Error-Code");
    if (code) {
      const error = JSON.parse(new TextDecoder().decode(msg.data));
      console.error(`error ${code} ${error.error_type}: ${error.error}`);
      return 1;
    }
    const embeddings = JSON.parse(new TextDecoder().decode(msg.data));
    if (!Array.isArray(embeddings) || embeddings.length !== texts.length) {
      console.error(`expected ${texts.length} vectors, got ${JSON.stringify(embeddings).slice(0, 200)}`);
      return 1;
    }
    embeddings.forEach((vector, i) => {
      const head = vector.slice(0, 4).map((x) => (x >= 0 ? "+" : "") + x.toFixed(4)).join(", ");
      console.log(`[nats] ${vector.length} dims  [${head}, ...]  ${texts[i]}`);
    });
    return 0;
  } finally {
    await nc.close();
  }
}

process.exitCode = await main();
