"""Makes compact-reference.json: the MiniLM reference vectors quantized as sentence-transformers'
`quantize_embeddings` quantizes them, the fixture of protocol/src/compact_tests.rs.

sentence-transformers imports torch, which CI does not install, so this script runs the exact
lines of `sentence_transformers/quantization.py` (`quantize_embeddings`, UKPLab/sentence-
transformers at commit 2b29783f) with numpy alone, on float32 input as `model.encode` returns it:

    starts = ranges[0, :]
    steps = (ranges[1, :] - ranges[0, :]) / 255
    uint8:   ((embeddings - starts) / steps).astype(np.uint8)
    int8:    ((embeddings - starts) / steps - 128).astype(np.int8)
    binary:  (np.packbits(embeddings > 0).reshape(embeddings.shape[0], -1) - 128).astype(np.int8)
    ubinary: np.packbits(embeddings > 0).reshape(embeddings.shape[0], -1)

with, for each vector on its own, `ranges = np.array([[-m] * d, [m] * d])` (float64), `m` the
largest absolute value of the vector: embatch's per-vector symmetric range
(docs/design/compact-outputs.md). Input: the first 12 vectors of the default-options case
of minilm-reference-embeddings.json (384 dimensions, a multiple of 8, so packbits' flat packing
equals per-row packing).

Command (numpy 2.4.6, Python 3.11): python3 testdata/make-compact-reference.py
"""
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N = 12


def main() -> None:
    data = json.loads((HERE / "minilm-reference-embeddings.json").read_text())
    case = next(c for c in data["cases"] if set(c["request"]) == {"inputs"})
    embeddings = np.array(case["embeddings"][:N], dtype=np.float64).astype(np.float32)
    d = embeddings.shape[1]

    def scalar(precision):
        rows = []
        for vector in embeddings:
            m = float(np.abs(vector).max())
            ranges = np.array([[-m] * d, [m] * d])
            starts = ranges[0, :]
            steps = (ranges[1, :] - ranges[0, :]) / 255
            if precision == "uint8":
                rows.append(((vector - starts) / steps).astype(np.uint8).tolist())
            else:
                rows.append(((vector - starts) / steps - 128).astype(np.int8).tolist())
        return rows

    out = {
        "made_by": "testdata/make-compact-reference.py (sentence-transformers' quantize_embeddings "
                   "formulas, per-vector ranges [-max|x|, max|x|])",
        "source": "the first 12 vectors of minilm-reference-embeddings.json's default case",
        "uint8": scalar("uint8"),
        "int8": scalar("int8"),
        "binary": (np.packbits(embeddings > 0).reshape(embeddings.shape[0], -1) - 128)
        .astype(np.int8).tolist(),
        "ubinary": np.packbits(embeddings > 0).reshape(embeddings.shape[0], -1).tolist(),
    }
    (HERE / "compact-reference.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
