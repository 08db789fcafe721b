"""Measures what each int8 range rule costs on real vectors, for docs/design/compact-outputs.md.

Vectors: the 30 MiniLM embeddings of minilm-reference-embeddings.json (default case, unit
length). For each rule, every vector is quantized to int8 with sentence-transformers' formula
(`trunc((x - start) / step - 128)`, `step = (end - start) / 255`), and the 435 pairwise cosine
similarities of the int8 vectors (as integers) are compared with the float ones: the largest
absolute error, and Spearman's rank correlation (ties are rare enough to rank by argsort).

The int8 vectors' raw dot products are ranked against the float cosines too (an inner-product
index compares them so). Rules: "fixed [-1, 1]" (embatch's), "per vector" (each vector's own
min and max), "per vector, symmetric" (`[-max |x|, max |x|]` of each vector),
"per dimension, this set" (sentence-transformers' default without calibration: min and max of
each dimension over the 30 vectors, which a server could only compute over a request's batch).

Command (numpy 2.4.6): python3 testdata/measure-compact-error.py
"""
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def int8(e, starts, ends):
    steps = (ends - starts) / 255
    return ((e - starts) / steps - 128).astype(np.int8)


def cosines(m):
    m = m.astype(np.float64)
    m = m / np.linalg.norm(m, axis=1, keepdims=True)
    return dots(m)


def dots(m):
    m = m.astype(np.float64)
    c = m @ m.T
    return c[np.triu_indices(len(m), 1)]


def spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return np.corrcoef(ra, rb)[0, 1]


def main() -> None:
    data = json.loads((HERE / "minilm-reference-embeddings.json").read_text())
    case = next(c for c in data["cases"] if set(c["request"]) == {"inputs"})
    e = np.array(case["embeddings"], dtype=np.float32)
    reference = cosines(e)
    d = e.shape[1]
    rules = {
        "fixed [-1, 1]": (np.full(d, -1.0), np.full(d, 1.0)),
        "per vector": (e.min(axis=1, keepdims=True), e.max(axis=1, keepdims=True)),
        "per vector, symmetric": (-np.abs(e).max(axis=1, keepdims=True),
                                  np.abs(e).max(axis=1, keepdims=True)),
        "per dimension, this set": (e.min(axis=0), e.max(axis=0)),
    }
    print(f"{len(e)} vectors x {d} dims; |x| max {np.abs(e).max():.3f}, "
          f"per-vector max |x| median {np.median(np.abs(e).max(axis=1)):.3f}")
    for name, (starts, ends) in rules.items():
        q = int8(e, starts, ends)
        got = cosines(q)
        used = len(np.unique(q))
        print(f"{name:26} max |cos error| {np.abs(got - reference).max():.4f}  "
              f"spearman {spearman(got, reference):.4f}  "
              f"dot-product spearman {spearman(dots(q), reference):.4f}  "
              f"distinct int8 values {used}")
    bits = np.unpackbits(np.packbits(e > 0, axis=1), axis=1)[:, :d].astype(np.float64) * 2 - 1
    got = cosines(bits)
    print(f"{'binary (sign)':26} max |cos error| {np.abs(got - reference).max():.4f}  "
          f"spearman {spearman(got, reference):.4f}")


if __name__ == "__main__":
    main()
