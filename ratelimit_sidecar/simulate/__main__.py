"""`python -m ratelimit_sidecar.simulate …`: the same as `ratelimit-sidecar simulate …`."""

from __future__ import annotations

import sys

from ratelimit_sidecar.simulate.cli import main

sys.exit(main(sys.argv[1:]))
