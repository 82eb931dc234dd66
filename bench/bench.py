#!/usr/bin/env python3
"""strata benchmarks: `python3 bench/bench.py --help` lists the cases and
options. The code is the strata_bench package next to this file (see
bench/README.md); this script only runs its command line."""
import os
import sys

# The package sits next to this file (under python3 -P or -I the script's
# directory is not on sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from strata_bench.cli import main  # noqa: E402 (needs the path above)

if __name__ == "__main__":
    main()
