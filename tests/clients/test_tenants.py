"""Real client libraries against a gateway with a tenants file (started by scripts/client-tests.sh
with tests/clients/tenants.toml).

Usage: python test_tenants.py GATEWAY_URL

The key goes where each library puts it (openai's api_key, huggingface_hub's token: both send
`Authorization: Bearer`); a wrong key must surface as the library's own authentication error.
Prints one PASS/FAIL line per check, then a summary; exits 1 when any check failed.
"""

import sys

from test_clients import DIMS, EXPECTED, TEXTS, compare, run_checks

KEY = "sk-clients-test"


def check_openai_key(gateway: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=gateway + "/v1", api_key=KEY)
    model = client.models.list().data[0].id
    raw = client.embeddings.with_raw_response.create(model=model, input=TEXTS)
    limit = raw.headers.get("x-ratelimit-limit-requests")
    assert limit == "100000", f"x-ratelimit-limit-requests {limit!r}"
    return compare([d.embedding for d in raw.parse().data]) + f", x-ratelimit-limit-requests {limit}"


def check_openai_wrong_key(gateway: str) -> str:
    import openai

    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-wrong", max_retries=0)
    try:
        client.embeddings.create(model="x", input="hello")
    except openai.AuthenticationError as error:
        assert error.code == "invalid_api_key", f"code {error.code!r}"
        return f"AuthenticationError {error.status_code} {error.code}"
    raise AssertionError("a wrong key was accepted")


def check_huggingface_hub_token(gateway: str) -> str:
    import numpy as np
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=gateway, token=KEY)
    out = np.atleast_2d(client.feature_extraction(TEXTS[0]))
    assert out.shape == (1, DIMS), f"shape {out.shape}"
    return compare([out[0]], TEXTS[:1], EXPECTED[:1])


def check_huggingface_hub_no_token(gateway: str) -> str:
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    client = InferenceClient(base_url=gateway, token=None)  # and no HF_TOKEN in the environment
    try:
        client.feature_extraction(TEXTS[0])
    except HfHubHTTPError as error:
        status = error.response.status_code
        assert status == 401, f"status {status}"
        return "HfHubHTTPError 401"
    raise AssertionError("a request without a key was accepted")


CHECKS = [
    ("openai", "a tenant's api_key embeds, with x-ratelimit headers", check_openai_key),
    ("openai", "a wrong api_key is AuthenticationError invalid_api_key", check_openai_wrong_key),
    ("huggingface_hub", "a tenant's token embeds", check_huggingface_hub_token),
    ("huggingface_hub", "no token is a 401", check_huggingface_hub_no_token),
]


def main() -> int:
    return run_checks(CHECKS, (sys.argv[1].rstrip("/"),), "tenant clients")


if __name__ == "__main__":
    sys.exit(main())
