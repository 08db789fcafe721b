#!/usr/bin/env python3
"""A small TEI-compatible embedding server on PyTorch: the GPU upstream of loadtest/gpu/run.sh.

This is NOT text-embeddings-inference. By default it is what a plain sentence-transformers service
is: one forward pass of the model per HTTP request, no batching across requests. One model thread
does every request's work in turn, from parsing the body to encoding the reply (one GPU stream);
the HTTP handler threads only read requests, hand them over and write the replies. With
--batch-tokens N it batches as TEI's queue does: every request waiting when the model thread is
free joins one forward pass, up to N tokens (TEI's --max-batch-tokens, default 16384); each
request's rows are then normalised and encoded on their own.

Two earlier versions ran the model in the handler threads themselves, one at a time under a lock
(first the forward pass alone, then everything from parsing to encoding). On an H100 a forward
pass then took 6 ms with 2-8 connections open, 14.6 ms with 64 and 53 ms with 256, on CPU the
same with any number. The cause was not found. With the model thread a forward pass of one
input took 4.3 ms with 64 connections and 3.8 ms with 256 on the same H100. It exists because the machine the GPU benchmark runs on has neither
network nor Docker, so TEI cannot be had there, while PyTorch, transformers and tokenizers can.

What it implements of TEI 1.9.3's API, as far as the embatch worker uses it:

- POST /embed: {"inputs": str | [str] | [int] | [[int]], "normalize": bool = true,
  "truncate": bool (absent: truncated, as TEI's auto_truncate), "truncation_direction":
  "Right"|"Left", "dimensions": int, "prompt_name": ignored} -> a JSON array of float arrays.
  Errors in TEI's body shape {"error": ..., "error_type": ...}, with the statuses embatch's
  protocol crate gives them: 400 Empty (no inputs, an empty input) and invalid JSON, 422
  Validation (wrong shape, more than --max-client-batch-size inputs, an input over the model's
  token limit with truncate false), 424 Backend (the model failed).
- GET /info: TEI's document (model_id, model_dtype, max_input_length, max_client_batch_size,
  max_batch_tokens, auto_truncate, ...). model_dtype is "float16" on CUDA, so the worker's
  BATCH_COST=auto counts tokens unpadded, as for TEI's CUDA backends.
- GET /health: 200 once the model is loaded and warm.
- GET /stats (not TEI): calls, inputs, seconds in forward passes (busy_s) and in the model
  thread's whole work (held_s), for the bench.

The model: a sentence-transformers BERT directory (config.json, model.safetensors, tokenizer.json,
sentence_bert_config.json, 1_Pooling/config.json; mean pooling assumed, as all-MiniLM-L6-v2),
loaded with transformers' AutoModel in --dtype on --device; mean pooling over the attention mask,
then L2 normalisation unless normalize is false, as sentence-transformers computes it.

Usage: tei_torch_server.py --model-dir DIR [--device cuda] [--dtype float16] [--port 8090]
Needs: torch, transformers, tokenizers (standard library otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from tokenizers import Tokenizer
from transformers import AutoModel

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


class ApiError(Exception):
    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


class Embedder:
    """The model, its tokenizer and the lock that serialises forward passes."""

    def __init__(self, model_dir: str, device: str, dtype: str, max_input_length: int | None):
        self.device = torch.device(device)
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        self.dtype_name = dtype
        try:
            model = AutoModel.from_pretrained(model_dir, dtype=self.dtype)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModel.from_pretrained(model_dir, torch_dtype=self.dtype)
        self.model = model.to(self.device).eval()
        if max_input_length is None:
            try:
                with open(os.path.join(model_dir, "sentence_bert_config.json")) as f:
                    max_input_length = int(json.load(f)["max_seq_length"])
            except (OSError, KeyError, ValueError):
                max_input_length = int(self.model.config.max_position_embeddings)
        self.max_input_length = max_input_length
        self.tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        # tokenizer.json may carry fixed padding/truncation (all-MiniLM-L6-v2's pads to 128):
        # this server pads each call to its longest input and truncates as the request says.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.calls = 0
        self.inputs = 0
        self.tokens = 0
        self.busy_s = 0.0
        self.held_s = 0.0
        self.stats_lock = threading.Lock()

    def tokenize(self, texts: list, truncate: bool, direction: str) -> list[list[int]]:
        """Token ids of each input (str or a list of ids), truncated or checked."""
        strings = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
        ids: list = [t if not isinstance(t, str) else None for t in texts]
        if strings:
            encodings = self.tokenizer.encode_batch([t for _, t in strings], add_special_tokens=True)
            for (i, _), enc in zip(strings, encodings):
                ids[i] = enc.ids
        limit = self.max_input_length
        out = []
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                if not truncate:
                    raise ApiError(
                        422,
                        "Validation",
                        f"Input validation error: `inputs` must have less than {limit} tokens. Given: {len(seq)}",
                    )
                if direction == "Left":
                    # Keep [CLS], drop from the left, as truncation_direction Left does.
                    seq = seq[:1] + seq[len(seq) - limit + 1 :] if isinstance(texts[i], str) else seq[-limit:]
                else:
                    seq = seq[: limit - 1] + seq[-1:] if isinstance(texts[i], str) else seq[:limit]
            out.append(list(seq))
        return out

    def embed(self, ids: list[list[int]], normalize: bool, dimensions: int | None) -> list[list[float]]:
        return finish(self.pooled(ids), normalize, dimensions)

    def pooled(self, ids: list[list[int]]) -> torch.Tensor:
        """One forward pass over `ids` (padded to the longest): the mean-pooled float32 rows, on
        the CPU."""
        longest = max(len(s) for s in ids)
        input_ids = torch.zeros((len(ids), longest), dtype=torch.long)
        mask = torch.zeros((len(ids), longest), dtype=torch.long)
        for row, seq in enumerate(ids):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        start = time.perf_counter()
        with torch.inference_mode():
            input_ids = input_ids.to(self.device, non_blocking=True)
            mask_d = mask.to(self.device, non_blocking=True)
            hidden = self.model(
                input_ids=input_ids,
                attention_mask=mask_d,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            m = mask_d.unsqueeze(-1).to(torch.float32)
            pooled = (hidden.to(torch.float32) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            pooled = pooled.cpu()  # synchronises: the GPU work is done here
        busy = time.perf_counter() - start
        with self.stats_lock:
            self.calls += 1
            self.inputs += len(ids)
            self.tokens += int(mask.sum())
            self.busy_s += busy
        return pooled

    def warm(self, max_batch: int) -> None:
        """Runs batch shapes up to `max_batch` inputs of up to the token limit (CUDA context,
        cuBLAS heuristics, the caching allocator)."""
        for n in [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= max_batch]:
            for length in (8, 16, 32, 64, 128, self.max_input_length):
                self.embed([[101] + [1000] * (length - 2) + [102]] * n, True, None)
        with self.stats_lock:
            self.calls = self.inputs = self.tokens = 0
            self.busy_s = self.held_s = 0.0


def finish(pooled: torch.Tensor, normalize: bool, dimensions: int | None) -> list[list[float]]:
    """Pooled rows cut to `dimensions` and L2-normalised, as sentence-transformers does."""
    if dimensions is not None:
        pooled = pooled[:, :dimensions]
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return pooled.tolist()


_ROW_FORMATS: dict[int, str] = {}


def encode_vectors(vectors: list[list[float]]) -> bytes:
    """The JSON array of float arrays, 9 significant digits a value (a float32 exactly, shorter
    than repr()), one %-format a row: about 6x faster than json.dumps of the lists."""
    rows = []
    for row in vectors:
        fmt = _ROW_FORMATS.get(len(row))
        if fmt is None:
            fmt = _ROW_FORMATS.setdefault(len(row), "[" + ",".join(["%.9g"] * len(row)) + "]")
        rows.append(fmt % tuple(row))
    return ("[" + ",".join(rows) + "]").encode()


def parse_request(body: bytes, max_client_batch_size: int):
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, "Validation", f"Failed to parse the request body as JSON: {err}")
    if not isinstance(request, dict) or "inputs" not in request:
        raise ApiError(422, "Validation", "Failed to deserialize the JSON body: missing field `inputs`")
    inputs = request["inputs"]
    if isinstance(inputs, str):
        texts = [inputs]
    elif isinstance(inputs, list) and inputs and all(isinstance(x, int) and not isinstance(x, bool) for x in inputs):
        texts = [inputs]  # one input of token ids
    elif isinstance(inputs, list):
        texts = inputs
        for x in texts:
            ok = isinstance(x, str) or (
                isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)
            )
            if not ok:
                raise ApiError(422, "Validation", "Failed to deserialize the JSON body: `inputs` has the wrong shape")
    else:
        raise ApiError(422, "Validation", "Failed to deserialize the JSON body: `inputs` has the wrong shape")
    if not texts:
        raise ApiError(400, "Empty", "`inputs` cannot be empty")
    for i, t in enumerate(texts):
        if len(t) == 0:
            raise ApiError(400, "Empty", f"`inputs` cannot be empty: input {i} is empty")
    if len(texts) > max_client_batch_size:
        raise ApiError(
            422,
            "Validation",
            f"batch size {len(texts)} > maximum allowed batch size {max_client_batch_size}: `inputs` must have "
            f"at most {max_client_batch_size} elements. Given: {len(texts)}",
        )
    normalize = request.get("normalize", True)
    truncate = request.get("truncate")
    direction = request.get("truncation_direction") or "Right"
    dimensions = request.get("dimensions")
    if not isinstance(normalize, bool) or (truncate is not None and not isinstance(truncate, bool)):
        raise ApiError(422, "Validation", "Failed to deserialize the JSON body: `normalize`/`truncate` must be booleans")
    if direction not in ("Right", "Left"):
        raise ApiError(422, "Validation", "Failed to deserialize the JSON body: unknown `truncation_direction`")
    if dimensions is not None and (not isinstance(dimensions, int) or dimensions < 1):
        raise ApiError(422, "Validation", "`dimensions` must be at least 1")
    return texts, normalize, truncate, direction, dimensions


class ModelThread:
    """The one thread that runs the model: requests are handed over through a queue. Without
    `batch_tokens` they are done one at a time, from parsing the body to encoding the reply;
    with it, as TEI's queue does, every request waiting when the model is free joins one forward
    pass, up to `batch_tokens` tokens (a request alone may exceed it)."""

    def __init__(self, embedder: Embedder, max_client_batch_size: int, auto_truncate: bool, warm_max_batch: int,
                 batch_tokens: int = 0):
        self.embedder = embedder
        self.max_client_batch_size = max_client_batch_size
        self.auto_truncate = auto_truncate
        self.batch_tokens = batch_tokens
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.carried = None  # a parsed request that did not fit the last forward pass
        ready = threading.Event()
        self.thread = threading.Thread(target=self.loop, args=(warm_max_batch, ready), daemon=True, name="model")
        self.thread.start()
        ready.wait()

    def submit(self, body: bytes):
        """(payload, token ids, forward start, forward end), or the ApiError to answer."""
        item = [body, threading.Event(), None]
        self.queue.put(item)
        item[1].wait()
        return item[2]

    def parse(self, item) -> tuple | None:
        """(item, ids, normalize, dimensions), or None when the item was answered with an error."""
        taken = time.perf_counter()
        try:
            texts, normalize, truncate, direction, dimensions = parse_request(item[0], self.max_client_batch_size)
            ids = self.embedder.tokenize(texts, self.auto_truncate if truncate is None else truncate, direction)
            return item, ids, normalize, dimensions
        except ApiError as err:
            item[2] = err
        except Exception as err:  # never leave a handler waiting
            item[2] = ApiError(424, "Backend", f"server error: {err}")
        finally:
            with self.embedder.stats_lock:
                self.embedder.held_s += time.perf_counter() - taken
        item[1].set()
        return None

    def gather(self) -> list[tuple]:
        """The next forward pass's requests: the first one waiting (blocking), then, when
        batching, those already queued while their tokens fit `batch_tokens`."""
        batch, tokens = [], 0
        while not batch:
            first = self.carried or self.parse(self.queue.get())
            self.carried = None
            if first is not None:
                batch, tokens = [first], sum(len(x) for x in first[1])
        while self.batch_tokens and tokens < self.batch_tokens:
            try:
                parsed = self.parse(self.queue.get_nowait())
            except queue.Empty:
                break
            if parsed is None:
                continue
            size = sum(len(x) for x in parsed[1])
            if tokens + size > self.batch_tokens:
                self.carried = parsed
                break
            batch.append(parsed)
            tokens += size
        return batch

    def loop(self, warm_max_batch: int, ready: threading.Event) -> None:
        if warm_max_batch > 0:
            self.embedder.warm(warm_max_batch)
        ready.set()
        embedder = self.embedder
        while True:
            batch = self.gather()
            taken = time.perf_counter()
            ids = [seq for _, request_ids, _, _ in batch for seq in request_ids]
            try:
                started = time.perf_counter()
                pooled = embedder.pooled(ids)
                done = time.perf_counter()
                row = 0
                for item, request_ids, normalize, dimensions in batch:
                    rows = pooled[row : row + len(request_ids)]
                    row += len(request_ids)
                    item[2] = (encode_vectors(finish(rows, normalize, dimensions)), request_ids, started, done)
            except Exception as err:  # the model failed: TEI's 424, for every request of the pass
                for item, _, _, _ in batch:
                    item[2] = ApiError(424, "Backend", f"model failed: {err}")
            with embedder.stats_lock:
                embedder.held_s += time.perf_counter() - taken
            for item, _, _, _ in batch:
                item[1].set()


def make_handler(embedder: Embedder, info: dict, model_thread: ModelThread):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as TEI (the worker pools its connections)
        disable_nagle_algorithm = True
        server_version = "tei-torch-server"

        def log_message(self, format, *args):  # noqa: A002 - no access log
            pass

        def send(self, status: int, body: bytes, extra: dict | None = None) -> None:
            head = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
            head.append("Content-Type: application/json")
            head.append(f"Content-Length: {len(body)}")
            for k, v in (extra or {}).items():
                head.append(f"{k}: {v}")
            # One write for headers and body.
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

        def error(self, err: ApiError) -> None:
            self.send(err.status, json.dumps({"error": err.message, "error_type": err.error_type}).encode())

        def do_GET(self):  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/health":
                self.send(200, b"")
            elif path == "/info":
                self.send(200, json.dumps(info).encode())
            elif path == "/stats":
                with embedder.stats_lock:
                    stats = {
                        "calls": embedder.calls,
                        "inputs": embedder.inputs,
                        "tokens": embedder.tokens,
                        "busy_s": embedder.busy_s,
                        "held_s": embedder.held_s,
                    }
                self.send(200, json.dumps(stats).encode())
            else:
                self.send(404, json.dumps({"error": "not found", "error_type": "Validation"}).encode())

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?")[0]
            if path not in ("/embed", "/"):
                self.send(404, json.dumps({"error": "not found", "error_type": "Validation"}).encode())
                return
            arrived = time.perf_counter()
            outcome = model_thread.submit(body)
            if isinstance(outcome, ApiError):
                self.error(outcome)
                return
            payload, ids, started, done = outcome
            self.send(
                200,
                payload,
                {
                    "x-compute-type": f"torch-{embedder.device.type}",
                    "x-inference-time": int((done - started) * 1000),
                    "x-total-time": int((time.perf_counter() - arrived) * 1000),
                    "x-compute-tokens": sum(len(s) for s in ids),
                },
            )

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # listen backlog: a burst of new connections is not dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float16 (default on cuda), bfloat16, float32 (default on cpu)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--max-client-batch-size", type=int, default=512)
    parser.add_argument("--max-input-length", type=int, default=None, help="default: sentence_bert_config's max_seq_length")
    parser.add_argument("--warm-max-batch", type=int, default=512, help="largest batch run at start (0: no warm-up)")
    parser.add_argument("--batch-tokens", type=int, default=0,
                        help="batch the requests waiting when the model is free into one forward pass of up to "
                             "this many tokens, as TEI's queue does with --max-batch-tokens (0: one request per pass)")
    args = parser.parse_args()
    dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")

    t0 = time.perf_counter()
    embedder = Embedder(args.model_dir, args.device, dtype, args.max_input_length)
    loaded = time.perf_counter() - t0
    model_thread = ModelThread(embedder, args.max_client_batch_size, True, args.warm_max_batch, args.batch_tokens)
    warmed = time.perf_counter() - t0 - loaded
    device_name = torch.cuda.get_device_name(embedder.device) if embedder.device.type == "cuda" else "cpu"
    info = {
        "model_id": MODEL_ID,
        "model_sha": None,
        "model_dtype": dtype,
        "model_type": {"embedding": {"pooling": "mean"}},
        "max_concurrent_requests": 512,
        "max_input_length": embedder.max_input_length,
        "max_batch_tokens": args.batch_tokens or 16384,
        "max_batch_requests": None,
        "max_client_batch_size": args.max_client_batch_size,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": "tei-torch-server (embatch loadtest/gpu; not TEI)",
        "sha": None,
        "docker_label": None,
    }
    server = Server((args.host, args.port), make_handler(embedder, info, model_thread))
    print(
        f"listening on {args.host}:{server.server_address[1]} device={device_name} dtype={dtype} "
        f"torch={torch.__version__} loaded_s={loaded:.1f} warm_s={warmed:.1f}",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
