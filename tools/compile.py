"""The request path compiled with mypyc: C extensions beside the sources.

    python -m tools.compile           # `make install` runs it: build in place, unless up to date
    python -m tools.compile --force   # build even if up to date
    python -m tools.compile --clean   # or `make uncompile`: back to the pure-Python modules

Python imports an extension module before a `.py` of the same name, so the built modules
replace the request path's sources in this checkout (an editable install) until cleaned; the
sources stay the fallback and the reference. A built module does not follow later edits of its
source: every `make` target that runs code rebuilds what is stale first, and the tests fail on a
stale build. The wheel is built the same way with RATELIMIT_SIDECAR_COMPILE=1 (setup.py).
Needs mypy (the dev extra, which ships mypyc) and a C compiler.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ratelimit_sidecar"
# What a ShouldRateLimit decision runs: the core, the handler and its encoder, the metrics'
# counters, the rule model it reads, the overrides applied to it, the servicer and the span clock.
SOURCES = (
    "core/*.py",
    "service/*.py",
    "metrics/*.py",
    "config/model.py",
    "overrides/applied.py",
    "grpc_server/rls.py",
    "sync/store_clock.py",
    "grpc_server/protocol/*.py",  # the gRPC port's HTTP/2 core, which every call goes through
)
GROUP = "ratelimit_sidecar.compiled"  # the shared library lands inside the package
# mypyc checks only the modules it compiles: the project's overrides for the others would be
# reported unused, which mypyc counts as an error.
MYPY_FLAGS = ("--no-warn-unused-configs",)


def sources() -> list[str]:
    """The compiled modules' files, relative to the checkout."""
    found = (path for pattern in SOURCES for path in PACKAGE.glob(pattern))
    # Not the packages' own modules: mypyc's build under a group name gives a compiled package
    # a wrong `__path__` (its submodules are not found); they only re-export names anyway.
    return sorted(str(path.relative_to(ROOT)) for path in found if path.name != "__init__.py")


def built() -> list[Path]:
    """The extension modules a build left in the package."""
    return sorted(PACKAGE.rglob("*.so"))


def stale() -> list[Path]:
    """Compiled sources edited since the build, which would run their old code. Against the
    shared library, which holds all of it: a module's own shim is not rebuilt by an edit."""
    library = sorted(PACKAGE.glob(GROUP.rpartition(".")[2] + "__mypyc.*.so"))
    if not library:
        return []
    built_at = library[0].stat().st_mtime
    return [ROOT / s for s in sources() if (ROOT / s).stat().st_mtime > built_at]


def up_to_date() -> bool:
    """A build is in place, with a module for every compiled source and none stale."""
    shims = {path.with_suffix("").with_suffix("") for path in built()}
    wanted = {(ROOT / source).with_suffix("") for source in sources()}
    return wanted <= shims and not stale()


def extensions() -> list[Any]:
    """The compiled modules as setuptools extensions: for this build and for setup.py's wheel."""
    from mypyc.build import mypycify

    return mypycify([*MYPY_FLAGS, *sources()], opt_level="3", group_name=GROUP)


def build() -> None:
    from setuptools import setup  # type: ignore[import-untyped]

    setup(
        name="ratelimit-sidecar-compiled",
        ext_modules=extensions(),
        script_args=["build_ext", "--inplace", "--build-temp", "build/mypyc"],
    )


def clean() -> list[Path]:
    removed = built()
    for path in removed:
        path.unlink()
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--clean"]:
        print(f"removed {len(clean())} extension modules: the pure-Python request path")
        return 0
    if args not in ([], ["--force"]):
        print(__doc__, file=sys.stderr)
        return 2
    if not args and up_to_date():
        print(f"the compiled request path is up to date ({len(built())} extension modules)")
        return 0
    started = time.monotonic()
    build()
    took = time.monotonic() - started
    print(f"compiled {len(sources())} modules in {took:.0f} s: {len(built())} extension modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
