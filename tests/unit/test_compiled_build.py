"""The mypyc build (tools/compile.py): what it compiles, which build the tests run, and no stale
module left behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ratelimit_sidecar.core import limiter
from ratelimit_sidecar.service import ratelimit
from tests.unit.conftest import SOURCES_ONLY
from tools import compile as mypyc_build


def test_the_request_path_is_compiled_and_no_package_init() -> None:
    sources = mypyc_build.sources()
    for module in ("core/limiter.py", "core/fixed_window.py", "service/ratelimit.py"):
        assert f"ratelimit_sidecar/{module}" in sources
    assert "ratelimit_sidecar/grpc_server/rls.py" in sources
    assert not [s for s in sources if s.endswith("__init__.py")]
    assert not [s for s in sources if "/transport/" in s or "/storage/" in s]


def test_the_tests_run_the_build_asked_for() -> None:
    """The sources under SIDECAR_SOURCES_ONLY (`make test`'s pure run), else the build if any."""
    compiled = bool(mypyc_build.built()) and not SOURCES_ONLY
    for module in (limiter, ratelimit):
        assert module.__file__ is not None
        assert module.__file__.endswith(".so" if compiled else ".py"), module.__file__


def test_the_wheel_compiles_the_same_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py hands tools/compile.py's extensions to setuptools when asked to compile."""
    handed: list[object] = []
    monkeypatch.setattr(sys, "path", list(sys.path))  # setup.py puts its folder first
    monkeypatch.setattr(mypyc_build, "extensions", lambda: ["the request path"])
    monkeypatch.setattr("setuptools.setup", lambda **kw: handed.append(kw.get("ext_modules")))
    monkeypatch.setenv("RATELIMIT_SIDECAR_COMPILE", "1")
    setup_py = mypyc_build.ROOT / "setup.py"
    exec(compile(setup_py.read_text(), str(setup_py), "exec"), {"__file__": str(setup_py)})
    monkeypatch.delenv("RATELIMIT_SIDECAR_COMPILE")
    exec(compile(setup_py.read_text(), str(setup_py), "exec"), {"__file__": str(setup_py)})
    assert handed == [["the request path"], None]


def test_no_built_module_is_older_than_its_source() -> None:
    """A module built by `make compile` shadows its source: after an edit it runs old code."""
    stale = mypyc_build.stale()
    assert not stale, f"stale compiled modules {stale}: run `make compile` or `make uncompile`"


def test_a_source_edited_after_the_build_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "ratelimit_sidecar"
    (package / "core").mkdir(parents=True)
    source = package / "core" / "limiter.py"
    library = package / "compiled__mypyc.cpython-311-x86_64-linux-gnu.so"
    source.write_text("")
    library.write_bytes(b"")
    monkeypatch.setattr(mypyc_build, "ROOT", tmp_path)
    monkeypatch.setattr(mypyc_build, "PACKAGE", package)
    os.utime(library, (1_000, 1_000))
    assert mypyc_build.stale() == [source]
    os.utime(source, (500, 500))
    assert mypyc_build.stale() == []
