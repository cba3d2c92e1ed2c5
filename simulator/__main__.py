"""`python -m simulator …`: the same as `ratelimit-sidecar simulate …` run from a checkout."""

from __future__ import annotations

import sys

from simulator.cli import main

sys.exit(main(sys.argv[1:]))
