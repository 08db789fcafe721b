"""`python3 -m loadtest.bench [--quick] [--only SCENARIO ...]` from the repository root."""

import sys

from .cli import main

sys.exit(main())
