#!/usr/bin/env python3
"""Checks compose.yaml's observe profile against its live Prometheus (scripts/compose-e2e.sh):

  targets PROM WORKERS TIMEOUT_S
        every active target is up, and they are the gateway, WORKERS worker replicas (found by
        Docker's DNS) and Prometheus itself; waits up to TIMEOUT_S for the first scrapes.
  traffic GATEWAY SECONDS
        sends embedding requests for SECONDS, 4 at a time: new inputs (cache misses, upstream
        calls), repeated ones (cache hits), a request with one input twice (deduplicated), and
        OpenAI's route. Prints one JSON line of counts by status.
  dashboard PROM DASHBOARD RATE_INTERVAL
        evaluates every query of the Grafana dashboard as Grafana would with every variable on
        "All": $__rate_interval is RATE_INTERVAL (Grafana's is at least 4 scrape intervals and
        1m with its default 15 s), the other variables their allValue. Each query must return at
        least one series with a number (not NaN: a histogram quantile over no observations is
        NaN, and Grafana draws nothing). A query with a `(A or on(...) 0 * B)` (generate.py's
        zero_when_none: a first-event counter drawn as 0 until its first event) must return data
        without that fallback too, unless A names a series of FAULT_ONLY below, with the reason
        that traffic without a fault cannot produce it. The variables' queries must list a model and a
        tenant.
  rules PROM RULES
        the alerts of RULES (deploy/prometheus/embatch-rules.yaml) are the ones the live
        Prometheus loaded, each evaluated without error; each expression also runs as a query
        through the HTTP API (it parses in this Prometheus' PromQL and evaluates).

Prints "ok MSG" / "fail MSG" / "info MSG" per line; exits 1 on a failure. Standard library only,
and PyYAML for `rules` (as scripts/checks/deploy.py).
"""

import concurrent.futures
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import outcome
from outcome import check, info

# First-event series that only a fault, or a pressure the e2e traffic does not cause, makes:
# their dashboard queries draw 0 until then (zero_when_none in generate.py). Keyed by the text
# that names the series in the query (a metric, or a metric with its first matcher).
FAULT_ONLY = {
    "embatch_worker_membership_changes_total":
        "a worker leaving or rejoining its queue group (full queue, upstream unhealthy, "
        "stopping); the first join is not counted, and a stopping worker's series end with it",
    "embatch_worker_cache_kv_errors_total": "a JetStream KV call failing or timing out",
    "embatch_worker_cache_writes_dropped_total": "256 writes to the KV bucket in flight",
    "embatch_worker_cache_evictions_total": "an LRU over CACHE_LOCAL_BYTES (64 MiB here)",
    "embatch_worker_cache_shared_reads_skipped_total":
        "a cold shared bucket: under 1 hit in 100 of a worker's last 256 or more reads (the e2e "
        "traffic's repeated inputs may keep every worker's ratio above it)",
    "embatch_worker_bulk_jobs_stalled_total": "a bulk job abandoned after no progress for 2 x BULK_ACK_WAIT",
    "embatch_worker_bulk_swept_total": "work-stream messages below a consumer's ack floor (after a nats-server restart)",
    'embatch_worker_tenant_requests_total{outcome="shed"':
        "a tenant's request shed (overload: a full queue, a deadline that cannot be met)",
    "embatch_gateway_tenant_quota_refused_total":
        "a tenant over its per-minute quota (a tenants file with quotas; compose runs open)",
}


def get(prom, path, **params):
    url = f"{prom}{path}" + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # Prometheus answers a bad query 400 with a JSON body
        return json.load(e)


# ------------------------------------------------------------------------------------------
# targets


def targets(prom, workers, timeout):
    want = {"gateway": 1, "worker": int(workers), "prometheus": 1}
    deadline = time.monotonic() + float(timeout)
    while True:
        active = get(prom, "/api/v1/targets", state="active")["data"]["activeTargets"]
        jobs = {}
        for t in active:
            jobs.setdefault(t["labels"]["job"], []).append(t)
        counts = {job: len(ts) for job, ts in jobs.items()}
        down = [f'{t["scrapeUrl"]} ({t["health"]}: {t["lastError"] or "not scraped yet"})'
                for t in active if t["health"] != "up"]
        if (counts == want and not down) or time.monotonic() > deadline:
            break
        time.sleep(1)
    check(counts == want, f"targets by job: {counts} (expected {want})")
    check(not down, f"all {len(active)} targets up" if not down else "targets not up: " + "; ".join(down))
    for t in sorted(active, key=lambda t: t["scrapeUrl"]):
        info(f'{t["labels"]["job"]}: {t["scrapeUrl"]} {t["health"]}')


# ------------------------------------------------------------------------------------------
# traffic


def traffic(gateway, seconds):
    words = "vector search batches embeddings queue worker gateway cache tenant model".split()

    def post(path, body):
        req = urllib.request.Request(f"{gateway}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return "error"

    def one(i):
        new = f"observe {i} {words[i % len(words)]} {time.time_ns()}"
        kind = i % 4
        if kind == 0:  # a new input: a cache miss and an upstream call
            return post("/embed", {"inputs": [new, "the same sentence again"]})
        if kind == 1:  # one input twice in one request: deduplicated
            return post("/embed", {"inputs": [new, new]})
        if kind == 2:  # OpenAI's route, a repeated input: a cache hit
            return post("/v1/embeddings", {"input": "a sentence the cache has seen"})
        return post("/embed", {"inputs": f"repeated {i % 8}"})  # hits after the first 8

    counts, i, end = {}, 0, time.monotonic() + float(seconds)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        while time.monotonic() < end:
            for status in pool.map(one, range(i, i + 16)):
                counts[str(status)] = counts.get(str(status), 0) + 1
            i += 16
    print(json.dumps({"sent": i, "statuses": counts}))
    return 0 if set(counts) == {"200"} else 1


# ------------------------------------------------------------------------------------------
# dashboard


def grafana_vars(dashboard, rate_interval):
    """Grafana's substitutions with every variable on "All"."""
    subst = {"__rate_interval": rate_interval, "__interval": "15s"}
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            subst[v["name"]] = v.get("allValue") or ".*"
    return subst


def substitute(expr, subst):
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in subst:
            raise KeyError(f"${name} is not a variable of the dashboard")
        return subst[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def numbers(result):
    """The finite values of an instant query's result."""
    values = []
    for r in result.get("data", {}).get("result", []):
        v = float(r["value"][1])
        if not math.isnan(v):
            values.append(v)
    return values


def query(prom, expr):
    r = get(prom, "/api/v1/query", query=expr)
    if r.get("status") != "success":
        return None, r.get("error", r)
    return r, None


def variables(prom, dashboard, subst):
    found = {}
    for v in dashboard["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        if not m:
            check(False, f"variable {v['name']}: cannot read its query {q!r}")
            continue
        selector, label = substitute(m.group(1), subst), m.group(2)
        r = get(prom, f"/api/v1/label/{label}/values", **{"match[]": selector})
        found[v["name"]] = r.get("data") or []
        info(f"variable {v['name']}: {found[v['name']] or 'no values'} ({q})")
    return found


def dashboard_check(prom, path, rate_interval):
    with open(path) as f:
        dashboard = json.load(f)
    subst = grafana_vars(dashboard, rate_interval)
    found = variables(prom, dashboard, subst)
    for name in ("model", "tenant"):
        check(bool(found.get(name)), f"variable {name} lists {found.get(name)}")
    if not found.get("namespace"):
        info("variable namespace: no values (compose's scrapes carry no namespace label); "
             "its All (.*) matches series without the label")

    checked = real = fallback_only = 0
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            checked += 1
            where = f"{p['title']} [{t['refId']}]"
            expr = substitute(t["expr"], subst)
            r, err = query(prom, expr)
            if r is None:
                check(False, f"{where}: the query fails: {err}\n  {expr}")
                continue
            values = numbers(r)
            if not values:
                check(False, f"{where}: no series with a number ({len(r['data']['result'])} series, "
                      f"all NaN or none): {t['expr']}")
                continue
            # zero_when_none: `(A\n  or on(...)\n0 * <one line>)`; A alone is the query without it.
            own = re.sub(r"\n  or on\([\w, ]*\)\n[^\n]*\)", ")", t["expr"])
            if own == t["expr"]:
                real += 1
                check(True, f"{where}: {len(values)} series")
                continue
            faults = [k for k in FAULT_ONLY if k in own]
            primary, err = query(prom, substitute(own, subst))
            if primary is None:
                check(False, f"{where}: the query without its fallback fails: {err}")
            elif numbers(primary):
                real += 1
                check(True, f"{where}: {len(numbers(primary))} series of its own events")
            elif faults:
                fallback_only += 1
                check(True, f"{where}: 0 per model or tenant (no event yet; fault-only: "
                      + "; ".join(f"{k}: {FAULT_ONLY[k]}" for k in faults) + ")")
            else:
                check(False, f"{where}: only its zero fallback returns data, and its series are not "
                      f"fault-only: the traffic should have produced them: {t['expr']}")
    check(checked > 0, f"dashboard: {checked} queries evaluated; {real} with their own series, "
          f"{fallback_only} fault-only queries at their zero fallback")


# ------------------------------------------------------------------------------------------
# rules


def load_rules(path):
    import yaml  # only here: the other commands need nothing beyond the standard library

    with open(path) as f:
        doc = yaml.safe_load(f)
    return [(r.get("alert") or r.get("record"), r["expr"]) for g in doc["groups"] for r in g["rules"]]


def rules(prom, path):
    want = load_rules(path)
    groups = get(prom, "/api/v1/rules")["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    check(sorted(loaded) == sorted(n for n, _ in want),
          f"Prometheus loaded the {len(loaded)} rules of {path.rsplit('/', 1)[-1]}"
          + ("" if sorted(loaded) == sorted(n for n, _ in want) else f": {sorted(loaded)}"))
    bad = [f"{n}: {r.get('health')} {r.get('lastError', '')}" for n, r in loaded.items()
           if r.get("health") != "ok"]
    check(not bad, "every rule evaluated without error (health ok)" if not bad else "; ".join(bad))
    firing = sorted(n for n, r in loaded.items() if r.get("state") not in (None, "inactive"))
    info(f"alerts pending or firing: {firing or 'none'}")
    errors = []
    for name, expr in want:
        r, err = query(prom, expr)
        if r is None:
            errors.append(f"{name}: {err}")
    check(not errors, f"the {len(want)} rules' expressions run as queries" if not errors else "; ".join(errors))


COMMANDS = {"targets": targets, "traffic": traffic, "dashboard": dashboard_check, "rules": rules}


if __name__ == "__main__":
    sys.exit(outcome.run(COMMANDS, sys.argv))
