"""Benchmarks: `python -m bench [section ...]` (`make bench`). See bench/__main__.py."""

from __future__ import annotations

import sys
from pathlib import Path

# The sections reuse the test suite's process helpers (tests/support): make them importable
# when `python -m bench` runs from another directory.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
