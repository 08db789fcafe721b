"""A stand-in for TEI in the tracing check (scripts/trace-check.sh): answers GET /info and
GET /health, and POST /embed with one 3-float vector per input, and writes the `traceparent` and
`tracestate` headers of every /embed call as one JSON line to the log file. Python's standard
library only.

Usage: python3 fake_tei.py PORT_FILE LOG_FILE    (binds 127.0.0.1 on a free port, writes it to
PORT_FILE once listening, serves until killed)
"""

import http.server
import json
import sys

INFO = {
    "model_id": "embatch/trace-check",
    "model_type": {"embedding": {"pooling": "mean"}},
    "max_client_batch_size": 32,
    "max_batch_tokens": 16384,
    "max_input_length": 512,
    "version": "1.9.3",
}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/info":
            self.reply(200, INFO)
        elif self.path == "/health":
            self.reply(200, {})
        else:
            self.reply(404, {"error": "not found", "error_type": "Validation"})

    def body(self):
        """The request body, sent with a Content-Length or chunked (as the worker streams it)."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def do_POST(self):
        body = self.body()
        if self.path != "/embed":
            self.reply(404, {"error": "not found", "error_type": "Validation"})
            return
        inputs = json.loads(body or b"{}").get("inputs", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        record = {
            "traceparent": self.headers.get("traceparent"),
            "tracestate": self.headers.get("tracestate"),
            "inputs": len(inputs),
        }
        with open(sys.argv[2], "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
        self.reply(200, [[0.25, 0.5, 0.75] for _ in inputs])

    def log_message(self, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w", encoding="utf-8") as port_file:
        port_file.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
