#!/usr/bin/env python3
"""embatch benchmarks: `python3 loadtest/bench.py [--quick] [--only SCENARIO ...] [--help]`.

The code is the package loadtest/bench/ (stack, defaults, scenarios, render, results, cli);
this file only runs its main, so `python3 -m loadtest.bench` from the repository root is the
same. Python 3 standard library only (the charts run matplotlib in .bin/bench-venv, which the
bench sets up from loadtest/requirements.txt), Linux only.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loadtest.bench.cli import main  # noqa: E402  (the package, not this file)

if __name__ == "__main__":
    sys.exit(main())
