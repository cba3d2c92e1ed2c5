"""`python -m ratelimit_sidecar` is the `ratelimit-sidecar` command."""

from __future__ import annotations

import sys

from ratelimit_sidecar.cli import main

sys.exit(main())
