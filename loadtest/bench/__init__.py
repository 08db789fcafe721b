"""embatch benchmarks as a package: `python3 loadtest/bench.py` (or `python3 -m loadtest.bench`
from the repository root) builds, starts, measures and stops everything itself.

    stack.py      processes (Child, Supervisor), ports, waiting, CPU accounting, and the stack
                  (nats-server, fake upstreams, workers, gateway, `embatch-loadtest run`)
    defaults.py   the binaries' defaults, parsed from their `--help`
    scenarios.py  the benchmark's own settings (fake GPU cost model, ...) and one function per
                  scenario
    report.py     accessors and number formats of one loadtest report
    render.py     RESULTS.md: one Markdown section per scenario and the targets table
    results.py    machine info, RESULTS.md, the docs/benchmarks.md block and the charts
    charts.py     SVG charts from the same JSON (matplotlib, in .bin/bench-venv)
    cli.py        the command line (`main`)
"""
