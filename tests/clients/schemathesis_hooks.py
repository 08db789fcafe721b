"""Schemathesis hooks for scripts/client-tests.sh (loaded through SCHEMATHESIS_HOOKS).

`x-embatch-timeout-ms` is documented in the gateway's OpenAPI document, so schemathesis sends
it, mostly with a few milliseconds. A request whose deadline passes before the model answers is
answered 504, as documented and intended; the `not_a_server_error` check would report it as a
server error. So a *valid* value (what the gateway accepts: optional spaces, an optional `+`, a
whole number from 1 to 2^64-1) is raised to 60000 ms (the gateway caps it at its REQUEST_TIMEOUT,
30 s by default): a 504 is then never the right answer, and any 5xx is a real defect. Invalid
values (0, negative, not a number) are sent as generated: the gateway must answer them 422.
"""

import re

import schemathesis

HEADER = "x-embatch-timeout-ms"
VALID = re.compile(r"\+?[0-9]+")
U64_MAX = 2**64 - 1


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    for name, value in list((case.headers or {}).items()):
        if name.lower() != HEADER or not isinstance(value, str):
            continue
        text = value.strip(" \t")
        if VALID.fullmatch(text) and 1 <= int(text) <= U64_MAX:
            case.headers[name] = "60000"
