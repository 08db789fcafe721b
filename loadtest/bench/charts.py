"""Charts of the benchmark results, drawn from the same JSON files as RESULTS.md.

    .bin/bench-venv/bin/python -m loadtest.bench.charts [RESULTS_DIR]

writes SVG files into RESULTS_DIR/charts/ (default loadtest/results/charts/), one per chart
below, and skips a chart whose scenario file is missing. It needs matplotlib, pinned in
loadtest/requirements.txt; `python3 loadtest/bench.py --charts-only` installs it into
.bin/bench-venv and runs this module there, so the bench itself stays standard-library only.
Each chart's footer names the command and the machine of its results (from the JSON files).

What the JSON holds decides what is drawn: the worker's batch-size histogram is recorded as its
mean (inputs per upstream call), so the batch chart shows means per run, not distributions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS_DIR = REPO / "loadtest" / "results"

# One colour per path, the same in every chart.
COLOURS = {"direct": "#7f7f7f", "gateway": "#1f77b4", "nats": "#ff7f0e", "relay": "#2ca02c",
           "before": "#d62728", "after": "#1f77b4"}

# Deterministic SVG: no creation date, fixed ids, so an unchanged result gives an unchanged file.
plt.rcParams.update({"svg.hashsalt": "embatch", "svg.fonttype": "none", "font.size": 10,
                     "axes.spines.top": False, "axes.spines.right": False,
                     "axes.grid": True, "grid.alpha": 0.3})


def load(out_dir: Path, name: str) -> dict | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def machine_line(res: dict, meta: dict) -> str:
    """The scenario's own machine when it names one, else `machine.json`'s."""
    machine = res.get("machine") or (f"{meta.get('cores', '?')} cores ({meta.get('cpu', '?')}), "
                                     f"{meta.get('kernel', '?')}")
    return f"{machine}, everything on one machine"


def footer(fig, res: dict, meta: dict) -> None:
    """Names the command and the machine under the chart."""
    fig.text(0.01, 0.01, f"$ {res.get('command', 'python3 loadtest/bench.py')}\n"
                         f"{machine_line(res, meta)}", fontsize=7, color="#555555", va="bottom",
             family="monospace")


def save(fig, res: dict, meta: dict, path: Path, bottom: float = 0.08) -> None:
    footer(fig, res, meta)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    print(f"wrote {path}")


def rate_runs(res: dict, path: str) -> list[dict]:
    return sorted((r for r in res["runs"] if r["path"] == path), key=lambda r: r["rate"])


def chart_goodput(res: dict, meta: dict, out: Path) -> None:
    """Scenario 1: goodput against offered load, per path, with the upstream's ceiling."""
    fig, ax = plt.subplots(figsize=(7, 4.4))
    top = max(r["rate"] for r in res["runs"])
    xs = [90 * (top / 90) ** (i / 50) for i in range(51)]  # y = x, drawn curved on log x
    ax.plot(xs, xs, ls=":", color="#999999", label="offered = goodput")
    ax.axhline(res["settings"]["ceiling"], ls="--", color="#999999", lw=0.8)
    ax.text(100, res["settings"]["ceiling"] * 1.02,
            f"ceiling with full batches ≈ {res['settings']['ceiling']:,.0f} req/s",
            fontsize=8, color="#555555")
    for path, marker, ms in (("direct", "o", 4), ("gateway", "o", 8), ("nats", "x", 6)):
        runs = rate_runs(res, path)
        ax.plot([r["rate"] for r in runs], [r["report"]["goodput"]["requests_per_s"]
                                            for r in runs],
                marker=marker, ms=ms, color=COLOURS[path],
                mfc="none" if path == "gateway" else COLOURS[path],
                label={"direct": "upstream alone (no batching)", "gateway": "embatch via HTTP "
                       "gateway", "nats": "embatch via NATS"}[path])
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered load, req/s (single-input requests, open loop; log scale)")
    ax.set_ylabel("goodput, req/s (successes within 2 s)")
    ax.set_title("Goodput against offered load: GPU-like upstream, one worker")
    ax.legend(loc="center left", fontsize=8)
    save(fig, res, meta, out / "goodput_vs_offered.svg")


def chart_latency(res: dict, meta: dict, out: Path) -> None:
    """Scenario 1: p50 and p99 of successes against offered load (embatch paths)."""
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for path in ("gateway", "nats"):
        runs = [r for r in rate_runs(res, path) if r["report"].get("latency")]
        x = [r["rate"] for r in runs]
        ax.plot(x, [r["report"]["latency"]["p50_ms"] for r in runs], marker="o", ms=4,
                color=COLOURS[path], label=f"{path}: p50")
        ax.plot(x, [r["report"]["latency"]["p99_ms"] for r in runs], marker="^", ms=4,
                ls="--", color=COLOURS[path], label=f"{path}: p99")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered load, req/s (open loop)")
    ax.set_ylabel("latency of successes, ms")
    ax.set_title("p50 / p99 against offered load: GPU-like upstream (5 ms + 20 µs/input)")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, res, meta, out / "latency_vs_offered.svg")


def chart_batches(tuning: dict | None, uneven: dict | None, meta: dict, out: Path) -> None:
    """Scenarios 6 and 10: mean inputs per upstream call."""
    panels = [p for p in (tuning, uneven) if p is not None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1, 4.4), squeeze=False)
    axes = list(axes[0])
    res = panels[0]
    if tuning is not None:
        ax = axes.pop(0)
        waits = sorted({r["max_wait_ms"] for r in tuning["runs"]})
        sizes = sorted({r["max_batch_size"] for r in tuning["runs"]})
        width = 0.8 / len(sizes)
        top = 0.0
        for i, size in enumerate(sizes):
            ys = []
            for w in waits:
                run = next(r for r in tuning["runs"]
                           if r["max_wait_ms"] == w and r["max_batch_size"] == size)
                ys.append((run["report"].get("batches") or {}).get("mean_batch_inputs") or 0)
            top = max([top] + ys)
            ax.bar([j + (i - (len(sizes) - 1) / 2) * width for j in range(len(waits))], ys,
                   width, label=f"MAX_BATCH_SIZE {size}")
        ax.set_xticks(range(len(waits)), [f"{w} ms" for w in waits])
        ax.set_xlabel("MAX_WAIT_TIME")
        ax.set_ylabel("mean inputs per upstream call")
        ax.set_title("6. 1,500 req/s: batch ≈ rate × call time", fontsize=9)
        ax.set_ylim(0, top * 1.35)  # room for the legend above the bars
        ax.legend(fontsize=7, ncol=3, loc="upper center")
    if uneven is not None:
        ax = axes.pop(0)
        labels, ys, colours = [], [], []
        for run in uneven["runs"]:
            for name, b in zip(("A (fast)", "B (5x slower)"), run["report"]["batches_by_worker"]):
                labels.append(f"{run['membership']}\n{name}")
                ys.append(b.get("mean_batch_inputs") or 0)
                colours.append(COLOURS["before" if run["when"] == "before" else "after"])
        ax.bar(range(len(ys)), ys, color=colours)
        ax.set_xticks(range(len(ys)), labels, fontsize=7)
        ax.set_ylabel("mean inputs per upstream call")
        ax.set_title("10. Two uneven workers at 1,000 req/s", fontsize=9)
        res = uneven if tuning is None else tuning
    fig.suptitle("Batch size: mean inputs per upstream call (the JSON records means)",
                 fontsize=10)
    save(fig, res, meta, out / "batch_size.svg")


def per_second(run: dict) -> tuple[list[int], list[int]]:
    ps = run["report"]["per_second"]
    # The last entry is a partial second (requests finishing after the measured window).
    return ps["goodput"][:-1], ps["completed"][:-1]


def chart_overload(overload: dict, meta: dict, out: Path) -> None:
    """Scenario 7: per second at 2x capacity, answered vs goodput, embatch against the upstream
    alone."""
    gpu = [r for r in overload["runs"] if r["upstream"] == "gpu" and not r.get("skipped")]
    fig, axes = plt.subplots(1, len(gpu), figsize=(5 * len(gpu), 4.6), squeeze=False)
    for ax, run in zip(axes[0], gpu):
        good, done = per_second(run)
        t = range(1, len(good) + 1)
        ax.plot(t, [run["rate"]] * len(good), ls=":", color="#999999", label="offered")
        ax.plot(t, done, color="#bbbbbb", marker=".", label="answered (any outcome)")
        ax.plot(t, good, color=COLOURS["gateway"], marker="o", ms=3,
                label="goodput (successes ≤ 2 s)")
        ax.axhline(run["capacity"], ls="--", lw=0.8, color="#555555")
        ax.text(len(good), run["capacity"] * 0.9, f"capacity {run['capacity']:,.0f} req/s",
                fontsize=8, ha="right")
        name = "upstream alone" if run["path"] == "direct" else "embatch (gateway)"
        ax.set_title(f"{name}: offered {run['rate']:,.0f} req/s", fontsize=9)
        ax.set_xlabel("second of the measured window")
        ax.set_ylabel("req/s")
        ax.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 0.07))
    fig.suptitle("7. Overload at 2x capacity over time, GPU-like upstream", fontsize=10)
    save(fig, overload, meta, out / "overload_over_time.svg", bottom=0.15)


def chart_recovery(slow: dict, meta: dict, out: Path) -> None:
    """Scenario 9: goodput per second around the switch from slow (4 s per call) to fast."""
    run = slow["runs"][0]
    good, done = per_second(run)
    offsets = slow["recovery"]["second_offsets_s"][:len(good)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(offsets, [run["rate"]] * len(offsets), ls=":", color="#999999", label="offered")
    ax.plot(offsets, done, color="#bbbbbb", marker=".", label="answered (incl. 429, timeouts)")
    ax.plot(offsets, good, color=COLOURS["gateway"], marker="o", ms=3,
            label="goodput (successes ≤ 2 s)")
    ax.axvline(0, color="#d62728", lw=1)
    ax.text(0.2, run["rate"] * 0.5, "upstream fast again", color="#d62728", fontsize=8)
    ax.set_xlabel("seconds from the switch (start of each one-second bucket)")
    ax.set_ylabel("req/s")
    ax.set_ylim(bottom=0)
    ax.set_title("9. Upstream slow (4 s per call), then fast: recovery", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    save(fig, slow, meta, out / "recovery.svg")


def chart_failover(sick: dict | None, kill: dict | None, meta: dict, out: Path) -> None:
    """Scenarios 11 and 12: goodput per second, static vs adaptive membership, around the
    kill."""
    panels = [(p, t) for p, t in ((sick, "11. One worker's upstream killed"),
                                  (kill, "12. One worker killed (SIGKILL)")) if p is not None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (res, title) in zip(axes[0], panels):
        for run in res["runs"]:
            good, _ = per_second(run)
            # Bucket i covers [i, i + 1) s of the measured window: drawn at its middle.
            ax.plot([i + 0.5 for i in range(len(good))], good, marker="o", ms=3,
                    color=COLOURS[run["when"]],
                    label=f"MEMBERSHIP={run['membership']}")
        ax.axvline(res["runs"][0]["kill_offset_s"], color="#555555", ls="--", lw=1)
        ax.text(res["runs"][0]["kill_offset_s"] + 0.1, 20, "kill", fontsize=8)
        ax.set_ylim(0, res["runs"][0]["rate"] * 1.15)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("second of the measured window")
        ax.set_ylabel("goodput, req/s (offered 200)")
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Failures during the load: goodput per second", fontsize=10)
    save(fig, panels[0][0], meta, out / "failover.svg")


def chart_pipeline(pipe: dict, meta: dict, out: Path) -> None:
    """Scenario 4: CPU time per request of each process, per path (stacked)."""
    procs = ["loadtest", "fake-upstream", "nats-server", "worker", "gateway"]
    colours = ["#c7c7c7", "#7f7f7f", "#2ca02c", "#ff7f0e", "#1f77b4"]
    fig, ax = plt.subplots(figsize=(7, 4))
    runs = pipe["runs"]
    bottoms = [0.0] * len(runs)
    for proc, colour in zip(procs, colours):
        ys = [1e6 * r["report"]["cpu_s"].get(proc, 0) / max(r["report"]["requests"]["succeeded"],
                                                              1) for r in runs]
        ax.barh(range(len(runs)), ys, left=bottoms, color=colour, label=proc)
        bottoms = [b + y for b, y in zip(bottoms, ys)]
    ax.set_yticks(range(len(runs)),
                  [f"{r['path']}\n{r['report']['throughput']['requests_per_s']:,.0f} req/s"
                   for r in runs])
    ax.set_xlabel("CPU µs per request (utime + stime of each process)")
    ax.set_title("4. Instant upstream, 256 in flight: where the CPU goes", fontsize=10)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    save(fig, pipe, meta, out / "pipeline_cpu.svg")


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv else RESULTS_DIR
    meta_path = out_dir / "machine.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    charts = out_dir / "charts"
    charts.mkdir(parents=True, exist_ok=True)
    res = {name: load(out_dir, name) for name in (
        "gpu_rates", "tuning", "uneven_workers", "overload", "slow_then_fast", "sick_upstream",
        "worker_kill", "pipeline")}
    if res["gpu_rates"]:
        chart_goodput(res["gpu_rates"], meta, charts)
        chart_latency(res["gpu_rates"], meta, charts)
    if res["tuning"] or res["uneven_workers"]:
        chart_batches(res["tuning"], res["uneven_workers"], meta, charts)
    if res["overload"]:
        chart_overload(res["overload"], meta, charts)
    if res["slow_then_fast"]:
        chart_recovery(res["slow_then_fast"], meta, charts)
    if res["sick_upstream"] or res["worker_kill"]:
        chart_failover(res["sick_upstream"], res["worker_kill"], meta, charts)
    if res["pipeline"]:
        chart_pipeline(res["pipeline"], meta, charts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
