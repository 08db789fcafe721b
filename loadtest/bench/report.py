"""Accessors and number formats of one `embatch-loadtest run --json` report."""

from __future__ import annotations


def goodput(r: dict) -> float:
    return r["goodput"]["requests_per_s"]


def throughput(r: dict) -> float:
    return r["throughput"]["requests_per_s"]


def lat(r: dict, key: str) -> float | None:
    return (r.get("latency") or {}).get(key)


def kind_latency(r: dict, kind: str, key: str) -> float | None:
    return ((r.get("error_latency_by_kind") or {}).get(kind) or {}).get(key)


def failures(r: dict) -> str:
    f = r.get("failures") or {}
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(f.items())) or "0"


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    # Three significant figures; the bounds are where rounding would add a digit (9.996 → 10.0).
    if x < 9.995:
        return f"{x:.2f}"
    if x < 99.95:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def summary_line(r: dict) -> str:
    line = (f"goodput {goodput(r):8,.1f} req/s  p50 {fmt_ms(lat(r, 'p50_ms')):>6} ms  "
            f"p99 {fmt_ms(lat(r, 'p99_ms')):>6} ms  failures {failures(r)}")
    b = r.get("batches")
    if b and b["mean_batch_inputs"] is not None:
        line += (f"  [batch {b['mean_batch_inputs']:.1f}, {b['upstream_calls_per_s']:.0f} calls/s,"
                 f" {b['mean_upstream_call_ms']:.2f} ms/call]")
    return line
