"""Compact outputs through the real SDKs (run by test_clients.py): Cohere's embed API with
`embedding_types`, and the OpenAI SDK with Voyage's `output_dtype` in `extra_body`.

Each quantized vector must equal the float vector the same call (or a float call) returned,
quantized here with numpy by the rules docs/http-api.md ("Compact outputs") states: an
implementation of the documented rules apart from the worker's Rust one.
"""
import numpy as np

DTYPES = ("int8", "uint8", "binary", "ubinary")


def quantize(vector, dtype: str) -> list[int]:
    """`vector` (floats as the gateway wrote them) in `dtype`, by docs/http-api.md's rules:
    int8/uint8 over the vector's own [-m, m], m = max |x| (in f64, as sentence-transformers'
    `(x - start) / step` with `step = (end - start) / 255`); binary/ubinary the sign bits,
    packed 8 per byte, most significant first."""
    x = np.asarray(vector, dtype=np.float32).astype(np.float64)
    if dtype in ("int8", "uint8"):
        m = float(np.abs(x).max()) or 1.0
        start, end = -m, m
        scaled = (x - start) / ((end - start) / 255)
        return np.trunc(scaled if dtype == "uint8" else scaled - 128).astype(int).tolist()
    packed = np.packbits(x > 0).astype(int)
    return (packed if dtype == "ubinary" else packed - 128).tolist()


def assert_quantized(floats, vectors, dtype: str) -> None:
    """`vectors` (from the SDK: ints, or floats holding ints) are `floats` in `dtype`."""
    assert len(vectors) == len(floats), f"{len(vectors)} {dtype} vectors for {len(floats)} texts"
    for i, (got, want) in enumerate(zip(vectors, floats)):
        got = [int(v) for v in got]
        assert got == quantize(want, dtype), f"{dtype} vector {i} differs from the rule's"


def check_cohere_embed_v2(gateway: str, model: str, texts, compare) -> str:
    import cohere

    client = cohere.ClientV2(base_url=gateway, api_key="unused")
    # As LangChain and LlamaIndex send it: MiniLM defines no `document` prompt, so the texts
    # are embedded as they are, equal to the reference.
    response = client.embed(model=model, input_type="search_document", texts=texts,
                            embedding_types=["float", "int8", "ubinary"])
    assert response.meta.api_version.version == "2", response.meta
    floats = response.embeddings.float_
    detail = compare(floats)
    assert_quantized(floats, response.embeddings.int8, "int8")
    assert_quantized(floats, response.embeddings.ubinary, "ubinary")
    assert len(response.embeddings.ubinary[0]) == len(floats[0]) // 8
    return f"{detail}; int8 and ubinary equal the documented rules"


def check_cohere_embed_v1(gateway: str, model: str, texts, compare) -> str:
    import cohere

    client = cohere.Client(base_url=gateway, api_key="unused")
    response = client.embed(model=model, texts=texts)
    assert response.response_type == "embeddings_floats", response.response_type
    return compare(response.embeddings)


def check_openai_output_dtype(gateway: str, model: str, texts, compare) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=gateway + "/v1", api_key="unused")
    floats = [d.embedding for d in client.embeddings.create(
        model=model, input=texts, encoding_format="float").data]
    compare(floats)
    # The SDK decodes base64 as float32, so compact types are asked as JSON numbers.
    for dtype in DTYPES:
        response = client.embeddings.create(model=model, input=texts, encoding_format="float",
                                            extra_body={"output_dtype": dtype})
        assert_quantized(floats, [d.embedding for d in response.data], dtype)
    return f"{len(texts)} inputs in {', '.join(DTYPES)}, each equal to the documented rules"
