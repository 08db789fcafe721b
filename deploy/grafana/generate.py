#!/usr/bin/env python3
"""Writes deploy/grafana/embatch.json, the embatch Grafana dashboard, from the panels below.

Edit the panels here and run `python3 deploy/grafana/generate.py`: scripts/deploy-check.sh fails
when embatch.json differs from what this prints, or when a query names a metric the gateway and
workers do not export. The chart ships a copy (deploy/helm/embatch/files/embatch-dashboard.json),
which the same check keeps identical; `--write` updates both.

Template variables: datasource, namespace, model, tenant. The tenant variable lists the tenants of
the workers' per-tenant metrics (`embatch_worker_tenant_*`); its "All" (`.*`) also matches series
without a `tenant` label, so every query filters by it and the per-tenant ones narrow.
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "embatch.json"
CHART_COPY = HERE.parent / "helm" / "embatch" / "files" / "embatch-dashboard.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every selector: the template variables (tenant matches series without the label too).
SEL = 'namespace=~"$namespace", model=~"$model", tenant=~"$tenant"'
RATE = "$__rate_interval"


def sel(extra=""):
    return "{" + (extra + ", " if extra else "") + SEL + "}"


def rate(metric, extra="", by="model"):
    return f"sum by ({by}) (rate({metric}{sel(extra)}[{RATE}]))"


def quantile(q, metric, by="model"):
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{sel()}[{RATE}])))"


def ratio(num, den):
    return f"{num}\n  /\n{den}"


# What each zero_when_none fallback counts as present: a model with a worker scraped, a tenant the
# workers or the gateways have answered.
PRESENT = {
    "model": "embatch_worker_queue_group_member",
    "worker tenant": "embatch_worker_tenant_requests_total",
    "gateway tenant": "embatch_gateway_tenant_requests_total",
}


def zero_when_none(expr, present="model"):
    """A query over a counter that exists only from its first event (a fault, a pressure, a shed
    tenant), with 0 for each model (or tenant) present that has none yet: the panel then says
    "none" rather than "No data", and still shows nothing when nothing is scraped. Honest for
    rates and increases: no event is a rate of 0. The fallback is one line after `or on(...)`,
    so that scripts/checks/observe.py can evaluate the query without it."""
    on = present.split()[-1]
    return f"({expr}\n  or on({on})\n0 * sum by ({on}) ({PRESENT[present]}{sel()}))"


def panel(title, description, targets, unit="short", kind="timeseries", stack=False, w=8, h=8,
          minimum=None, maximum=None):
    defaults = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 0,
            "showPoints": "never",
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        }
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}} if kind == "timeseries" else
                   {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "textMode": "auto"},
        "targets": [
            {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True,
             "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(targets)
        ],
        "_size": (w, h),
    }


def rates_by(title, description, metric, by, unit="reqps"):
    """A stacked panel of one counter's rate, a series for each value of the `by` labels, named
    by them ("{{model}} {{reason}}")."""
    legend = " ".join("{{" + label.strip() + "}}" for label in by.split(","))
    return panel(title, description, [(rate(metric, by=by), legend)], unit=unit, stack=True)


def p50_p99(title, description, metric):
    """A panel of a histogram's (`metric`, in seconds) median and 99th percentile per model."""
    return panel(title, description, [(quantile(0.5, metric), "p50 {{model}}"),
                                      (quantile(0.99, metric), "p99 {{model}}")], unit="s")


ROWS = [
    ("Traffic", [
        panel("Goodput", "Requests answered with embeddings per second: by the workers (outcome ok) "
              "and by the gateways (HTTP 200).",
              [(rate("embatch_worker_requests_total", 'outcome="ok"'), "{{model}} workers"),
               (rate("embatch_gateway_requests_total", 'status="200"'), "{{model}} gateways")],
              unit="reqps"),
        rates_by("Load shed by reason", "Requests refused at admission (429, or 504 for `expired`): "
                 "queue_full (QUEUE_CAP), queue_bytes (MAX_QUEUE_BYTES), queue_delay (MAX_QUEUE_DELAY), "
                 "deadline (cannot finish in time), expired, fair_share (queued, then shed for a tenant "
                 "under its share).",
                 "embatch_worker_requests_shed_total", "model, reason"),
        panel("Shed ratio", "Shed requests over all requests the workers answered.",
              [(ratio(rate("embatch_worker_requests_shed_total"),
                      rate("embatch_worker_requests_total", 'outcome!~"duplicate|handed_back"')),
                "{{model}}")],
              unit="percentunit", minimum=0),
        rates_by("Worker answers by outcome", "Requests the workers answered: ok or the error kind "
                 "(overloaded, deadline_exceeded, backend, cancelled, ...).",
                 "embatch_worker_requests_total", "outcome"),
        rates_by("Gateway responses by status", "Embedding requests the gateways answered, by HTTP "
                 "status (499: the client hung up first).",
                 "embatch_gateway_requests_total", "status"),
        panel("Gateway load", "Requests in progress and open HTTP connections over all gateways; "
              "NATS requests resent by reason.",
              [(f'sum(embatch_gateway_requests_in_flight{{namespace=~"$namespace"}})', "in flight"),
               (f'sum(embatch_gateway_connections{{namespace=~"$namespace"}})', "connections"),
               (f'sum by (reason) (rate(embatch_client_retries_total{{namespace=~"$namespace"}}[{RATE}]))',
                "retries/s {{reason}}"),
               (f'sum(rate(embatch_gateway_connections_refused_total{{namespace=~"$namespace"}}[{RATE}]))',
                "refused connections/s")]),
    ]),
    ("Tenants", [
        rates_by("Requests by tenant", "Requests (and bulk lines) the workers answered per tenant: "
                 "ok, shed (429), failed (424, 5xx), refused (other 4xx).",
                 "embatch_worker_tenant_requests_total", "tenant, outcome"),
        panel("Inputs and tokens by tenant", "Inputs and tokens of the requests answered 200, per "
              "tenant and lane (interactive, bulk): each tenant's share of the upstream.",
              [(rate("embatch_worker_tenant_inputs_total", by="tenant, lane"),
                "inputs {{tenant}} {{lane}}"),
               (rate("embatch_worker_tenant_tokens_total", by="tenant, lane"),
                "tokens {{tenant}} {{lane}}")],
              unit="ops"),
        panel("Shed ratio by tenant", "Each tenant's shed requests over its requests: under "
              "contention the tenant furthest over its share sheds first.",
              [(ratio(zero_when_none(rate("embatch_worker_tenant_requests_total", 'outcome="shed"',
                                          by="tenant"), "worker tenant"),
                      rate("embatch_worker_tenant_requests_total", by="tenant")),
                "{{tenant}}")],
              unit="percentunit", minimum=0),
        panel("Gateway answers by tenant", "Embedding requests the gateways answered per tenant "
              "and HTTP status, with the inputs and tokens of those answered 200 "
              "(docs/tenants.md, Usage).",
              [(rate("embatch_gateway_tenant_requests_total", by="tenant, status"),
                "{{tenant}} {{status}}"),
               (rate("embatch_gateway_tenant_inputs_total", by="tenant"), "inputs {{tenant}}"),
               (rate("embatch_gateway_tenant_tokens_total", by="tenant"), "tokens {{tenant}}")],
              unit="ops"),
        panel("Quota refusals by tenant", "Requests the gateways refused 429 because the "
              "tenant's requests_per_minute or tokens_per_minute was spent (docs/tenants.md, "
              "Quotas).",
              [(zero_when_none(rate("embatch_gateway_tenant_quota_refused_total", by="tenant, limit"),
                               "gateway tenant"),
                "{{tenant}} {{limit}}")],
              unit="reqps", stack=True),
    ]),
    ("Latency", [
        p50_p99("Gateway latency p50 / p99", "Embedding requests as the gateways see them.",
                "embatch_gateway_request_seconds"),
        p50_p99("Worker latency p50 / p99", "Acceptance to answer in the workers.",
                "embatch_worker_request_seconds"),
        p50_p99("Queue wait p50 / p99", "Acceptance to a request's first upstream call.",
                "embatch_worker_queue_wait_seconds"),
        p50_p99("Upstream call p50 / p99", "One upstream call (TEI or the built-in model).",
                "embatch_worker_upstream_seconds"),
        p50_p99("Cache hit latency p50 / p99", "Arrival to reply of requests answered entirely from "
                "the cache.",
                "embatch_worker_cache_hit_seconds"),
        p50_p99("Bulk line latency p50 / p99", "A bulk line's submission to the batcher to its "
                "embeddings.",
                "embatch_worker_bulk_upstream_seconds"),
    ]),
    ("Batching", [
        panel("Batch size", "Inputs per upstream call: the mean and the p50 / p99 (MAX_BATCH_SIZE "
              "caps it); requests per call.",
              [(ratio(rate("embatch_worker_batch_inputs_sum"), rate("embatch_worker_batch_inputs_count")),
                "mean inputs {{model}}"),
               (quantile(0.5, "embatch_worker_batch_inputs"), "p50 inputs {{model}}"),
               (quantile(0.99, "embatch_worker_batch_inputs"), "p99 inputs {{model}}"),
               (ratio(rate("embatch_worker_batch_requests_sum"), rate("embatch_worker_batch_requests_count")),
                "mean requests {{model}}")]),
        panel("Padding", "Tokens over padded tokens (longest input x inputs) over all upstream calls, "
              "and the median call's: 1 is no padding; well below 0.8 under load on a padded upstream means BATCH_COST or the "
              "window is wrong.",
              [(ratio(rate("embatch_worker_batch_tokens_sum"), rate("embatch_worker_batch_padded_tokens_sum")),
                "{{model}}"),
               (quantile(0.5, "embatch_worker_batch_padding_ratio"), "p50 per call {{model}}")],
              unit="percentunit", minimum=0, maximum=1),
        panel("Tokens per call", "Mean tokens and padded tokens per upstream call.",
              [(ratio(rate("embatch_worker_batch_tokens_sum"), rate("embatch_worker_batch_tokens_count")),
                "tokens {{model}}"),
               (ratio(rate("embatch_worker_batch_padded_tokens_sum"),
                      rate("embatch_worker_batch_padded_tokens_count")), "padded {{model}}")]),
        panel("Queue depth", "Inputs waiting for an upstream call, and upstream calls in flight, over "
              "all workers of the model (KEDA's interactive-queue trigger reads the first).",
              [(f"sum by (model) (embatch_worker_queue_inputs{sel()})", "queued inputs {{model}}"),
               (f"sum by (model) (embatch_worker_batches_in_flight{sel()})", "calls in flight {{model}}")]),
        rates_by("Upstream calls by outcome", "Upstream calls: ok, rejected (the upstream blamed an "
                 "input), failed.",
                 "embatch_worker_upstream_calls_total", "model, outcome"),
        panel("Inputs without upstream work", "Inputs folded into an equal one in flight or in the "
              "same call, and batch tasks that panicked.",
              [(zero_when_none(rate("embatch_worker_dedup_inputs_total", by="model, where")),
                "dedup {{model}} {{where}}"),
               (f"sum by (model) (increase(embatch_worker_batches_crashed_total{sel()}[{RATE}]))",
                "panicked {{model}}")]),
    ]),
    ("Queue-group membership", [
        panel("Members and workers", "Workers in the model's queue group (taking requests) against "
              "all its workers scraped.",
              [(f"sum by (model) (embatch_worker_queue_group_member{sel()})", "members {{model}}"),
               (f"count by (model) (embatch_worker_queue_group_member{sel()})", "workers {{model}}")],
              w=12),
        panel("Membership changes", "Joins and leaves by the new state: joined, full, "
              "upstream_unhealthy, stopping.",
              [(zero_when_none(f"sum by (model, event, state) "
                               f"(increase(embatch_worker_membership_changes_total{sel()}[{RATE}]))"),
                "{{model}} {{event}} {{state}}")],
              w=12),
    ]),
    ("Cache", [
        panel("Cache hit rate", "Inputs answered from the cache over inputs looked up (hits + misses).",
              [(ratio(rate("embatch_worker_cache_hits_total"),
                      f'({rate("embatch_worker_cache_hits_total")} + {rate("embatch_worker_cache_misses_total")})'),
                "{{model}}")],
              unit="percentunit", minimum=0, maximum=1),
        panel("Cache hits and misses", "Inputs per second by tier (local LRU, shared KV bucket), and "
              "misses sent upstream.",
              [(rate("embatch_worker_cache_hits_total", by="model, tier"), "hit {{model}} {{tier}}"),
               (rate("embatch_worker_cache_misses_total"), "miss {{model}}")],
              unit="ops"),
        panel("Cache errors and pressure", "KV calls failed or timed out by op; writes dropped; "
              "shared reads skipped while the bucket is cold; LRU evictions.",
              [(zero_when_none(rate("embatch_worker_cache_kv_errors_total", by="model, op")),
                "kv error {{model}} {{op}}"),
               (zero_when_none(rate("embatch_worker_cache_writes_dropped_total")), "writes dropped {{model}}"),
               (zero_when_none(rate("embatch_worker_cache_shared_reads_skipped_total")),
                "reads skipped {{model}}"),
               (zero_when_none(rate("embatch_worker_cache_evictions_total")), "evictions {{model}}")],
              unit="ops"),
        panel("Cache memory", "Bytes held by the workers' in-process LRUs (each at most "
              "CACHE_LOCAL_BYTES).",
              [(f"sum by (model) (embatch_worker_cache_local_bytes{sel()})", "{{model}}")],
              unit="bytes", w=24, h=6),
    ]),
    ("Bulk", [
        panel("Bulk progress", "Inputs embedded for bulk jobs per second, and those sent in the room "
              "interactive batches left.",
              [(rate("embatch_worker_bulk_inputs_total"), "inputs {{model}}"),
               (rate("embatch_worker_bulk_top_up_inputs_total"), "top-up inputs {{model}}")],
              unit="ops"),
        rates_by("Bulk work items", "Work items (chunks of lines) handled: ack (done), term (done, a "
                 "line refused), nak (given back after an upstream failure).",
                 "embatch_worker_bulk_items_total", "model, outcome", unit="ops"),
        panel("Bulk lines and stalls", "Bulk lines by outcome; jobs abandoned for no progress and "
              "messages given back by the sweep.",
              [(rate("embatch_worker_bulk_lines_total", by="model, outcome"), "lines {{model}} {{outcome}}"),
               (zero_when_none(f"sum by (model) (increase(embatch_worker_bulk_jobs_stalled_total{sel()}[{RATE}]))"),
                "stalled jobs {{model}}"),
               (zero_when_none(f"sum by (model) (increase(embatch_worker_bulk_swept_total{sel()}[{RATE}]))"),
                "swept {{model}}")]),
    ]),
]


def variable(name, label, query, multi=False):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"}, "definition": query,
        "refresh": 2, "sort": 1, "includeAll": True, "allValue": ".*", "multi": multi,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [], "hide": 0,
    }


def dashboard():
    panels, y, next_id = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "collapsed": False, "id": next_id,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x, row_h = 0, 0
        for p in row:
            w, h = p.pop("_size")
            if x + w > 24:
                x, y = 0, y + row_h
                row_h = 0
            p["id"] = next_id
            next_id += 1
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panels.append(p)
            x += w
            row_h = max(row_h, h)
        y += row_h
    return {
        "title": "embatch",
        "uid": "embatch",
        "description": "embatch gateways and workers: goodput, shedding, tenants, latency, "
                       "batching, queue-group membership, cache and bulk jobs "
                       "(docs/observability.md).",
        "tags": ["embatch"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": []},
            variable("namespace", "Namespace",
                     "label_values(embatch_worker_queue_group_member, namespace)"),
            variable("model", "Model",
                     'label_values(embatch_worker_queue_group_member{namespace=~"$namespace"}, model)',
                     multi=True),
            variable("tenant", "Tenant",
                     "label_values(embatch_worker_tenant_requests_total, tenant)", multi=True),
        ]},
        "panels": panels,
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    text = render()
    if "--write" in sys.argv:
        OUT.write_text(text)
        CHART_COPY.write_text(text)
        print(f"wrote {OUT} and {CHART_COPY}")
    else:
        sys.stdout.write(text)
