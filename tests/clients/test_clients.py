"""Real client libraries against a running embatch stack (started by scripts/client-tests.sh).

Usage: python test_clients.py GATEWAY_URL NATS_URL

Each check calls the gateway (or NATS) through an unmodified, pinned client library
(tests/clients/requirements.txt) and compares every vector it gets with the reference embeddings
that a real text-embeddings-inference 1.9.3 server produced for the same inputs
(testdata/minilm-reference-embeddings.json; cosine >= 0.999, see testdata/README.md).
Prints one PASS/FAIL line per check, then a summary; exits 1 when any check failed.
"""

import asyncio
import json
import math
import sys
import time
import traceback
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIN_COSINE = 0.999
DIMS = 384

# A few of the reference inputs: plain English, a long sentence, Japanese, emoji.
PICK = [0, 2, 16, 17]


def load_reference() -> tuple[list[str], list[list[float]]]:
    data = json.loads((REPO / "testdata/minilm-reference-embeddings.json").read_text())
    # The case with default options (normalize: true, no truncate): all 30 inputs.
    case = next(c for c in data["cases"] if set(c["request"]) == {"inputs"})
    inputs, embeddings = case["request"]["inputs"], case["embeddings"]
    return [inputs[i] for i in PICK], [embeddings[i] for i in PICK]


TEXTS, EXPECTED = load_reference()


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def compare(vectors, texts=TEXTS, expected=EXPECTED) -> str:
    """Raises AssertionError naming the input when a vector is missing, misshapen or wrong."""
    vectors = [[float(x) for x in v] for v in vectors]
    assert len(vectors) == len(texts), f"{len(vectors)} vectors for {len(texts)} inputs"
    worst = 1.0
    for text, got, want in zip(texts, vectors, expected):
        assert len(got) == DIMS, f"{len(got)} dims, want {DIMS}, for {text!r}"
        c = cosine(got, want)
        assert c >= MIN_COSINE, f"cosine {c:.6f} < {MIN_COSINE} against the reference for {text!r}"
        worst = min(worst, c)
    return f"{len(vectors)} vectors x {DIMS} dims, min cosine {worst:.6f}"


def check_huggingface_hub(gateway: str, nats_url: str) -> str:
    import numpy as np
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=gateway)
    vectors = []
    for text in TEXTS:
        out = np.atleast_2d(client.feature_extraction(text))
        assert out.shape == (1, DIMS), f"shape {out.shape} for {text!r}, want (1, {DIMS})"
        vectors.append(out[0])
    return compare(vectors)


def check_openai_base64(gateway: str, nats_url: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=gateway + "/v1", api_key="unused")
    # The model as GET /v1/models lists it (a name no worker serves is a 404).
    model = client.models.list().data[0].id
    # No encoding_format: the SDK asks for base64 and decodes it itself.
    response = client.embeddings.create(model=model, input=TEXTS)
    assert [d.index for d in response.data] == list(range(len(TEXTS))), "indices out of order"
    return compare([d.embedding for d in response.data])


def check_openai_float(gateway: str, nats_url: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=gateway + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    response = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert [d.index for d in response.data] == list(range(len(TEXTS))), "indices out of order"
    return compare([d.embedding for d in response.data])


def check_openai_batch(gateway: str, nats_url: str) -> str:
    import openai_batch

    # The reference inputs (also checked against TEI's vectors) and 44 more.
    texts = TEXTS + openai_batch.synthetic_texts(44)
    result = openai_batch.run(gateway, texts, timeout_s=120)
    compare(result["vectors"][:len(TEXTS)])
    return (f"{result['inputs']} inputs, each custom_id once, min cosine "
            f"{result['min_cosine']:.6f} against /v1/embeddings; the reference inputs match TEI")


RERANKER = "tei-double-reranker"  # the second worker scripts/client-tests.sh starts
QUERY = "What is the capital of the United States?"
DOCUMENTS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific.",
]


def tei_rerank_scores(gateway: str) -> dict[int, float]:
    """Each document's score from TEI's own route, POST /models/<reranker>/rerank."""
    import urllib.request

    body = json.dumps({"query": QUERY, "texts": DOCUMENTS}).encode()
    request = urllib.request.Request(f"{gateway}/models/{RERANKER}/rerank", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return {rank["index"]: rank["score"] for rank in json.load(response)}


def check_results(results, expected: dict[int, float], top_n: int) -> str:
    """`results` (the SDK's objects) are the `top_n` best of `expected`, best first, each with
    exactly TEI's score."""
    got = [(r.index, r.relevance_score) for r in results]
    best = sorted(expected.items(), key=lambda item: item[1], reverse=True)[:top_n]
    assert got == best, f"got {got}, want {best}"
    return f"{len(got)} results, best index {got[0][0]} at {got[0][1]:.4f}, equal to POST /rerank's"


def check_cohere_v2(gateway: str, nats_url: str) -> str:
    import cohere

    client = cohere.ClientV2(base_url=gateway, api_key="unused")
    response = client.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert response.meta.api_version.version == "2", response.meta
    return check_results(response.results, tei_rerank_scores(gateway), 3)


def check_cohere_v1(gateway: str, nats_url: str) -> str:
    import cohere

    client = cohere.Client(base_url=gateway, api_key="unused")
    documents = [{"text": text} for text in DOCUMENTS]
    response = client.rerank(model=RERANKER, query=QUERY, documents=documents,
                             return_documents=True)
    for result in response.results:
        assert result.document.text == DOCUMENTS[result.index], result
    return check_results(response.results, tei_rerank_scores(gateway), len(DOCUMENTS))


def check_hf_sentence_similarity(gateway: str, nats_url: str) -> str:
    """POST /similarity through huggingface_hub: each similarity equals the cosine of TEI's
    reference vectors (the built-in MiniLM's vectors are within MIN_COSINE of them)."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=f"{gateway}/similarity")
    got = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    want = [cosine(EXPECTED[0], e) for e in EXPECTED[1:]]
    assert len(got) == len(want), f"{len(got)} similarities for {len(want)} sentences"
    worst = max(abs(g - w) for g, w in zip(got, want))
    assert worst < 1e-3, f"similarities {got}, reference {want}"
    return f"{len(got)} similarities, max difference from the reference {worst:.2e}"


def check_hf_text_classification(gateway: str, nats_url: str) -> str:
    """POST /models/<reranker>/predict through huggingface_hub: the label and score the gateway
    answers over plain HTTP for the same text."""
    import urllib.request

    from huggingface_hub import InferenceClient

    url = f"{gateway}/models/{RERANKER}/predict"
    client = InferenceClient(model=url)
    out = client.text_classification(DOCUMENTS[0])
    # TEI's single-sequence reply is one list; the SDK returns its first element (as with TEI).
    first = out[0] if isinstance(out, list) else out
    body = json.dumps({"inputs": DOCUMENTS[0]}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        want = json.load(response)[0]
    assert (first.label, first.score) == (want["label"], want["score"]), f"{first} vs {want}"
    return f"label {first.label} at {first.score:.4f}, equal to POST /predict's"


def check_llama_index(gateway: str, nats_url: str) -> str:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    model = TextEmbeddingsInference(base_url=gateway, model_name="x")
    single = model.get_text_embedding(TEXTS[0])
    compare([single], TEXTS[:1], EXPECTED[:1])
    return compare(model.get_text_embedding_batch(TEXTS))


def check_nats_py(gateway: str, nats_url: str) -> str:
    import nats

    async def run():
        nc = await nats.connect(nats_url)
        try:
            # The snippet of README.md and docs/nats-contract.md, as written there.
            reply = await nc.request("embed", json.dumps({"inputs": TEXTS}).encode(), timeout=10,
                                     headers={"Embatch-Deadline-Ms": "10000"})
            if (reply.headers or {}).get("Nats-Service-Error-Code"):
                raise RuntimeError(json.loads(reply.data)["error"])
            vectors = json.loads(reply.data)
            return compare(vectors)
        finally:
            await nc.close()

    return asyncio.run(run())


def check_nats_py_no_responders(gateway: str, nats_url: str) -> str:
    import nats
    from nats.errors import NoRespondersError

    async def run():
        nc = await nats.connect(nats_url)
        try:
            await nc.request("embatch-client-tests.nobody-serves-this", b'{"inputs":["x"]}', timeout=5)
        except NoRespondersError:
            return "NoRespondersError at once, as the README says (-> 503)"
        finally:
            await nc.close()
        raise AssertionError("a subject nobody serves got a reply")

    return asyncio.run(run())


def compact(name: str):
    """The check `name` of compact_checks.py (compact outputs), run against the default model
    (as GET /v1/models lists it first) with this file's texts and reference comparison."""
    def check(gateway: str, nats_url: str) -> str:
        import compact_checks
        from openai import OpenAI

        model = OpenAI(base_url=gateway + "/v1", api_key="unused").models.list().data[0].id
        return getattr(compact_checks, name)(gateway, model, TEXTS, compare)

    return check


CHECKS = [
    ("huggingface_hub", "InferenceClient(base_url).feature_extraction(text)", check_huggingface_hub),
    ("huggingface_hub", "InferenceClient(model=.../similarity).sentence_similarity(s, others)",
     check_hf_sentence_similarity),
    ("huggingface_hub", "InferenceClient(model=.../predict).text_classification(text)",
     check_hf_text_classification),
    ("openai", "embeddings.create(), SDK default (base64)", check_openai_base64),
    ("openai", "embeddings.create(encoding_format='float')", check_openai_float),
    ("openai", "files.create, batches.create, batches.retrieve until done, files.content "
               "(tests/clients/openai_batch.py)", check_openai_batch),
    ("llama-index-embeddings-text-embeddings-inference",
     "TextEmbeddingsInference.get_text_embedding(s)", check_llama_index),
    ("cohere", "ClientV2(base_url).rerank(model, query, documents, top_n)", check_cohere_v2),
    ("cohere", "Client(base_url).rerank(documents=[{'text'}], return_documents=True)",
     check_cohere_v1),
    ("cohere", "ClientV2(base_url).embed(texts, embedding_types=['float', 'int8', 'ubinary'])",
     compact("check_cohere_embed_v2")),
    ("cohere", "Client(base_url).embed(texts) (v1, embeddings_floats)",
     compact("check_cohere_embed_v1")),
    ("openai", "embeddings.create(extra_body={'output_dtype': int8|uint8|binary|ubinary})",
     compact("check_openai_output_dtype")),
    ("nats-py", "nc.request('embed', ...) (README snippet)", check_nats_py),
    ("nats-py", "no responders on an unserved subject", check_nats_py_no_responders),
]


def run_checks(checks, args, name: str) -> int:
    """Runs each (package, what, check) with `args`, printing one PASS/FAIL line per check and
    a summary naming `name`; 1 when any check failed."""
    failed = 0
    for package, what, check in checks:
        label = f"{package} {version(package)}: {what}"
        start = time.monotonic()
        try:
            detail = check(*args)
            print(f"PASS  {label} — {detail} ({time.monotonic() - start:.1f}s)", flush=True)
        except Exception as error:  # noqa: BLE001 - every failure is reported, then counted
            failed += 1
            print(f"FAIL  {label} — {type(error).__name__}: {error}", flush=True)
            traceback.print_exc()
    print(f"{name}: {len(checks) - failed} of {len(checks)} checks passed")
    return 1 if failed else 0


def main() -> int:
    return run_checks(CHECKS, (sys.argv[1].rstrip("/"), sys.argv[2]), "python clients")


if __name__ == "__main__":
    sys.exit(main())
