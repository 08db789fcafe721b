"""Asserts that Jaeger holds one request's trace as embatch exports it (scripts/trace-check.sh):
the caller's span → the gateway's → the worker's, with admission, the batcher's request span and
its queue wait, the batch and the upstream call, every parent and link resolved inside the trace,
and that TEI received the upstream call's own `traceparent`. Reads Jaeger's query API
(`GET /api/v3/traces/{id}`: OTLP JSON), retrying until every span has arrived or the time is up.

Usage: python3 check_trace.py QUERY_URL TRACE_ID CALLER_SPAN_ID TEI_LOG    Prints PASS/FAIL lines
and a closing "N passed, N failed"; exits 1 on any failure. TRACE_DUMP=1 also lists every span
with its attributes on stderr.
"""

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request

WANTED = {
    "gateway": "POST /embed",
    "worker": "process embed",
    "admission": "admission",
    "batcher": "embed_request",
    "queue_wait": "queue_wait",
    "batch": "upstream_batch",
    "upstream": "upstream tei",
}
# The caller's tracestate, which scripts/trace-check.sh sends and every hop passes on.
TRACESTATE = "embatch=trace-check"
KIND_SERVER, KIND_CLIENT = (2, "SPAN_KIND_SERVER"), (3, "SPAN_KIND_CLIENT")


def hex_id(value):
    """An OTLP JSON id as lower-case hex (Jaeger writes hex; protobuf JSON would be base64)."""
    if not value:
        return ""
    if all(c in "0123456789abcdefABCDEF" for c in value) and len(value) in (16, 32):
        return value.lower()
    return base64.b64decode(value).hex()


def fetch(query, trace_id):
    """The trace's spans as dicts with `service` added; [] while Jaeger has none of it."""
    try:
        with urllib.request.urlopen(f"{query}/api/v3/traces/{trace_id}", timeout=5) as response:
            document = json.load(response)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return []
        raise
    spans = []
    for resource in document.get("result", {}).get("resourceSpans", []):
        attributes = resource.get("resource", {}).get("attributes", [])
        service = next((a["value"].get("stringValue") for a in attributes if a["key"] == "service.name"), "?")
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                span["service"] = service
                spans.append(span)
    return spans


def main():
    query, trace_id, caller_span, tei_log = sys.argv[1:5]
    deadline = time.monotonic() + 30
    while True:
        spans = fetch(query, trace_id)
        names = {s["name"] for s in spans}
        if set(WANTED.values()) <= names or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if os.environ.get("TRACE_DUMP"):
        for span in spans:
            attributes = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
            print(f"  {span['service']}: {span['name']} kind={span.get('kind')} "
                  f"id={hex_id(span['spanId'])} parent={hex_id(span.get('parentSpanId'))} "
                  f"links={len(span.get('links', []))} {attributes}", file=sys.stderr)
    results = []

    def check(ok, label, detail=""):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {label}" + ("" if ok else f" — {detail}"), flush=True)

    by_name = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    found = {key: (by_name.get(name) or [None])[0] for key, name in WANTED.items()}
    missing = [name for key, name in WANTED.items() if found[key] is None]
    check(not missing, f"trace {trace_id} holds the gateway, worker and upstream spans",
          f"missing {missing}; Jaeger has {sorted(by_name)}")
    if missing:
        print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
        sys.exit(1)

    sid = {key: hex_id(span["spanId"]) for key, span in found.items()}
    parent = {key: hex_id(span.get("parentSpanId")) for key, span in found.items()}
    kind = {key: span.get("kind") for key, span in found.items()}
    service = {key: span["service"] for key, span in found.items()}

    check(service["gateway"] == "embatch-gateway" and all(
        service[k] == "embatch-worker" for k in WANTED if k != "gateway"),
        "services: the gateway's span from embatch-gateway, the others from embatch-worker", str(service))
    check(parent["gateway"] == caller_span and kind["gateway"] in KIND_SERVER,
          "the gateway's span is a server span under the caller's traceparent",
          f"parent {parent['gateway']}, kind {kind['gateway']}")
    for child, parent_key in [("worker", "gateway"), ("admission", "worker"), ("batcher", "worker"),
                              ("queue_wait", "batcher"), ("batch", "batcher"), ("upstream", "batch")]:
        check(parent[child] == sid[parent_key], f"{WANTED[child]} is a child of {WANTED[parent_key]}",
              f"its parent is {parent[child]}, not {sid[parent_key]}")
    check(kind["upstream"] in KIND_CLIENT, "the upstream call is a client span", str(kind["upstream"]))
    links = [(hex_id(link.get("traceId")), hex_id(link.get("spanId"))) for link in found["batch"].get("links", [])]
    check((trace_id, sid["batcher"]) in links, "the batch links to the request it serves", str(links))

    with open(tei_log, encoding="utf-8") as log:
        calls = [json.loads(line) for line in log if line.strip()]
    sent = [c.get("traceparent") for c in calls]
    want = f"00-{trace_id}-{sid['upstream']}-01"
    check(want in sent, "TEI received the upstream call's traceparent", f"want {want}, TEI got {sent}")
    states = [c.get("tracestate") for c in calls]
    check(TRACESTATE in states, "and the caller's tracestate", f"want {TRACESTATE}, TEI got {states}")

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
