"""With SIDECAR_SOURCES_ONLY=1 the unit suite runs the package's Python sources even where the
compiled build sits beside them (Python would import an extension module first): `make test`
runs the package's unit tests once so, for the pure build, before the whole suite compiled."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import SOURCE_SUFFIXES, FileFinder, ModuleSpec, SourceFileLoader
from types import ModuleType

PACKAGE = "ratelimit_sidecar"
SOURCES_ONLY = os.environ.get("SIDECAR_SOURCES_ONLY") == "1"


class SourcesOnly:
    """Finds the package's modules as `.py` files only, ahead of the default finders."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] != PACKAGE:
            return None
        for entry in path or sys.path:
            found = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(name, target)
            if found is not None:
                return found
        return None


if SOURCES_ONLY:
    if any(name.partition(".")[0] == PACKAGE for name in sys.modules):
        raise RuntimeError(f"{PACKAGE} was imported before tests/unit/conftest.py")
    sys.meta_path.insert(0, SourcesOnly())
