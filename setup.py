"""The wheel; with RATELIMIT_SIDECAR_COMPILE=1, its request path compiled by mypyc, as
`make install` builds it in a checkout (tools/compile.py: which modules, and how)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, beside this file

if os.environ.get("RATELIMIT_SIDECAR_COMPILE") == "1":
    from tools.compile import extensions

    setup(ext_modules=extensions())
else:
    setup()
