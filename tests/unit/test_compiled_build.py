"""The opt-in mypyc build (tools/compile.py): what it compiles, and no stale module left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools import compile as mypyc_build


def test_the_request_path_is_compiled_and_no_package_init() -> None:
    sources = mypyc_build.sources()
    for module in ("core/limiter.py", "core/fixed_window.py", "service/ratelimit.py"):
        assert f"ratelimit_sidecar/{module}" in sources
    assert "ratelimit_sidecar/server/grpc_api.py" in sources
    assert not [s for s in sources if s.endswith("__init__.py")]
    assert not [s for s in sources if "/transport/" in s or "/storage/" in s]


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
