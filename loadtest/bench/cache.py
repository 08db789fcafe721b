"""The cache scenarios: repeated traffic on the GPU-like upstream with the workers' cache on
and off.

Kept apart from scenarios.py: this module adds its scenario to SCENARIOS / SCENARIO_FUNCS
(scenarios.py imports it last) and its renderer to render.py's tables."""

from __future__ import annotations

from . import scenarios as sc
from .procs import BenchError, http_get, log
from .report import failures, fmt_ms, goodput, lat
from .stack import Stack

ZIPF_UNIQUE = 10_000
ZIPF_S = 1.1
CACHE_RATE = 4000  # req/s, open loop: 200k requests in 50 s (~70% of the full-batch ceiling)
CACHE_MODES = (("cache off", "false"), ("cache on", "true"))
HIT_HISTOGRAM = "embatch_worker_cache_hit_seconds"


def scrape(url: str) -> dict[str, float]:
    """Every sample of the Prometheus page at `url`, by series (`name{labels}`)."""
    status, body = http_get(url)
    if status != 200:
        raise BenchError(f"{url} answered {status}")
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            out[series] = float(value)
        except ValueError:
            pass
    return out


def total(samples: dict[str, float], name: str) -> float:
    """The sum of every series of metric `name` (all label values)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def labelled(samples: dict[str, float], name: str, label: str) -> dict[str, float]:
    """The series of `name` by the value of `label`."""
    out = {}
    for k, v in samples.items():
        if k.startswith(name + "{") and f'{label}="' in k:
            out[k.split(f'{label}="', 1)[1].split('"', 1)[0]] = v
    return out


def histogram_quantiles(samples: dict[str, float], name: str,
                        qs=(0.5, 0.99)) -> dict[str, float | None]:
    """Quantiles (ms) of Prometheus histogram `name`, interpolated linearly inside its buckets
    (as Prometheus' histogram_quantile does)."""
    buckets = []
    for k, v in samples.items():
        if k.startswith(name + "_bucket{") and 'le="' in k:
            le = k.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), v))
    buckets.sort()
    count = buckets[-1][1] if buckets else 0
    out: dict[str, float | None] = {}
    for q in qs:
        key = f"p{q * 100:g}_ms"
        if not count:
            out[key] = None
            continue
        rank, lower, below = q * count, 0.0, 0.0
        out[key] = None
        for upper, cum in buckets:
            if cum >= rank:
                if upper == float("inf"):
                    out[key] = lower * 1e3
                else:
                    inside = cum - below
                    share = (rank - below) / inside if inside else 1.0
                    out[key] = (lower + (upper - lower) * share) * 1e3
                break
            lower, below = upper, cum
    out["count"] = count
    return out


def scenario_cache_zipf(b: Stack) -> dict:
    rate = CACHE_RATE if not b.quick else 1000
    warmup, duration = b.d(5, 2), b.d(45, 8)
    runs, worker_settings = [], {}
    for label, cache in CACHE_MODES:
        mark = b.sup.mark()
        try:
            nats = b.nats()
            _, up = b.fake_upstream(sc.GPU_BASE_MS, sc.GPU_PER_INPUT_US, 1)
            w = b.worker(nats, tei_url=up, CACHE=cache)
            b.wait_workers(nats, [w])
            r = b.load(f"{label} @ {rate} req/s", nats.target(), rate=rate, warmup=warmup,
                       duration=duration, timeout=sc.TIMEOUT_S, workers=[w],
                       extra_args=["--zipf-unique", str(ZIPF_UNIQUE), "--zipf-s", f"{ZIPF_S:g}"])
            m = scrape(f"http://127.0.0.1:{w.metrics_port}/metrics")
            zipf = r["run"].get("zipf") or {}
            cache_stats = {
                "upstream_inputs": total(m, "embatch_worker_batch_inputs_sum"),
                "upstream_calls": total(m, "embatch_worker_batch_inputs_count"),
                "distinct_sent": zipf.get("distinct_sent"),
                "hits": labelled(m, "embatch_worker_cache_hits_total", "tier"),
                "misses": total(m, "embatch_worker_cache_misses_total"),
                "dedup": labelled(m, "embatch_worker_dedup_inputs_total", "where"),
                "kv_errors": labelled(m, "embatch_worker_cache_kv_errors_total", "op"),
                "evictions": total(m, "embatch_worker_cache_evictions_total"),
                "local_bytes": total(m, "embatch_worker_cache_local_bytes"),
                "hit_latency": histogram_quantiles(m, HIT_HISTOGRAM),
            }
            r["cache"] = cache_stats
            log(f"  cache: {cache_stats}")
            worker_settings = {k: v for k, v in w.settings.items() if k != "CACHE"}
            runs.append(sc.run_entry(label, {"cache": cache, "rate": rate}, r))
        finally:
            b.sup.stop_since(mark)
    return {"settings": {"upstream": sc.GPU_UPSTREAM, "worker": worker_settings,
                         "rate": rate, "warmup_s": warmup, "duration_s": duration,
                         "timeout_s": sc.TIMEOUT_S, "zipf_unique": ZIPF_UNIQUE, "zipf_s": ZIPF_S,
                         "requests": int(rate * (warmup + duration))},
            "runs": runs}


sc.SCENARIOS += [("cache_zipf", "C1. Repeated inputs (Zipf s = 1.1 over 10k texts): the cache "
                                "on and off")]
sc.SCENARIO_NAMES += ["cache_zipf"]
sc.SCENARIO_FUNCS["cache_zipf"] = scenario_cache_zipf


# ---- rendering (render.py adds these) ----

def us(ms: float | None) -> str:
    """Microseconds, whole, from milliseconds."""
    return "-" if ms is None else f"{ms * 1e3:,.0f}"


def render_cache_zipf(res: dict, targets: list) -> list[str]:
    s = res["settings"]
    out = [f"One worker with its defaults (CACHE as shown) on {s['upstream']}; NATS with "
           f"JetStream; single-input requests over NATS, open loop at {s['rate']:,} req/s for "
           f"{s['warmup_s']:g} s of warm-up and {s['duration_s']:g} s measured "
           f"(~{s['requests']:,} requests), each text drawn from {s['zipf_unique']:,} distinct "
           f"texts by a Zipf law with s = {s['zipf_s']:g}; {s['timeout_s']:g} s timeout. Inputs "
           f"upstream and distinct texts count the whole run (the cache starts empty); goodput "
           f"and p50/p99 are of the measured window. A hit's latency is the worker's "
           f"`{HIT_HISTOGRAM}` histogram (arrival to reply, requests answered entirely from "
           f"the cache), interpolated inside its buckets.", "",
           "| run | distinct texts sent | inputs upstream | upstream / distinct | upstream calls "
           "| goodput req/s | p50 ms | p99 ms | failures | hits (local / shared) | hit p50 µs "
           "| hit p99 µs |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    ratio_on = hit_p99 = None
    for run in res["runs"]:
        r, c = run["report"], run["report"]["cache"]
        distinct = c.get("distinct_sent") or 0
        ratio = c["upstream_inputs"] / distinct if distinct else None
        hits = c.get("hits") or {}
        hl = c.get("hit_latency") or {}
        if run["cache"] == "true":
            ratio_on, hit_p99 = ratio, hl.get("p99_ms")
        out.append(f"| {run['label']} | {distinct:,} | {c['upstream_inputs']:,.0f} | "
                   f"{'-' if ratio is None else f'{ratio:.3f}'} | {c['upstream_calls']:,.0f} | "
                   f"{goodput(r):,.0f} | {fmt_ms(lat(r, 'p50_ms'))} | {fmt_ms(lat(r, 'p99_ms'))}"
                   f" | {failures(r)} | {hits.get('local', 0):,.0f} / {hits.get('shared', 0):,.0f}"
                   f" | {us(hl.get('p50_ms'))} | {us(hl.get('p99_ms'))} |")
    if ratio_on is not None:
        targets.append(("cache: inputs upstream <= 1.02 x distinct inputs", f"{ratio_on:.3f}",
                        ratio_on <= 1.02))
    if hit_p99 is not None:
        targets.append(("cache: a hit's p99 in the worker <= 1 ms", f"{fmt_ms(hit_p99)} ms",
                        hit_p99 <= 1.0))
    return out


RENDERERS = {"cache_zipf": render_cache_zipf}
SHOWS = {"cache_zipf": "That repeated inputs cost the upstream once: the inputs sent upstream "
                       "against the distinct inputs, goodput and latency with the cache on and "
                       "off, and what a hit costs in the worker."}
