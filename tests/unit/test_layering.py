"""The package's layers, checked on the source: no import cycle, and each layer's allowed imports.

The core decides from numbers only (no network, no event loop, no clock of its own); the config
package only parses and matches rules. Both stay importable and testable without the rest.
"""

from __future__ import annotations

from pathlib import Path

import ratelimit_sidecar
from harness.imports import ImportGraph, find_cycle, import_cycle, import_graph

PACKAGE_DIR = Path(ratelimit_sidecar.__file__).parent
GENERATED = ("_proto",)
CORE_FORBIDDEN = (
    "grpc",
    "redis",
    "asyncio",
    "time",
    "ratelimit_sidecar.app",
    "ratelimit_sidecar.grpc_server",
    "ratelimit_sidecar.http_server",
    "ratelimit_sidecar.sync",
    "ratelimit_sidecar.rules",
    "ratelimit_sidecar.overrides",
    "ratelimit_sidecar.storage",
    "ratelimit_sidecar.service",
    "simulator",
    "ratelimit_sidecar.cli",
    "ratelimit_sidecar.metrics",
)
CONFIG_FORBIDDEN = tuple(
    f"ratelimit_sidecar.{layer}"
    for layer in (
        "core",
        "storage",
        "service",
        "overrides",
        "app",
        "grpc_server",
        "http_server",
        "sync",
        "rules",
    )
)


def forbidden_imports(
    graph: ImportGraph, layer: str, forbidden: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(module, import) pairs where a module of `layer` imports a name under `forbidden`."""
    return sorted(
        (module, name)
        for module, names in graph.items()
        if module == layer or module.startswith(layer + ".")
        for name in names
        if any(name == prefix or name.startswith(prefix + ".") for prefix in forbidden)
    )


def test_no_import_cycle_in_the_package() -> None:
    cycle = import_cycle(PACKAGE_DIR, skip=GENERATED)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_import_cycle_in_the_benchmarks_or_the_harness() -> None:
    root = PACKAGE_DIR.parent
    for directory in (root / "bench", root / "harness", root / "simulator"):
        cycle = import_cycle(directory)
        assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_package_module_is_a_monolith() -> None:
    """A loose bound: a module past it has grown several jobs. A state machine is one class
    however long (split by a real seam, never by a line count), so the bound is far above one."""
    sizes = {
        str(path.relative_to(PACKAGE_DIR)): len(path.read_text().splitlines())
        for path in PACKAGE_DIR.rglob("*.py")
        if GENERATED[0] not in path.parts
    }
    assert {name: lines for name, lines in sizes.items() if lines > 1_000} == {}


def test_the_package_imports_no_simulator() -> None:
    """The simulator is a development tool beside the package, outside the wheel; only the
    `simulate` subcommand looks for it in a checkout, by path."""
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    assert forbidden_imports(graph, "ratelimit_sidecar", ("simulator",)) == []


def test_core_imports_no_io_and_no_higher_layer() -> None:
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    assert forbidden_imports(graph, "ratelimit_sidecar.core", CORE_FORBIDDEN) == []


def test_config_imports_no_other_layer() -> None:
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    assert forbidden_imports(graph, "ratelimit_sidecar.config", CONFIG_FORBIDDEN) == []


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Lazy, relative and `from package import module` imports all become edges."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import thing\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("import time\nfrom ..a import f\nthing = 1\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"time", "pkg.a"}
    assert import_cycle(package) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert forbidden_imports(graph, "pkg.sub", ("time",)) == [("pkg.sub.b", "time")]


def test_find_cycle_ignores_imports_from_outside_the_graph() -> None:
    assert find_cycle({"a": {"b", "os"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
