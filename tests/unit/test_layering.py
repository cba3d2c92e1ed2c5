"""The package's layers, checked on the source: no import cycle, and each layer's allowed imports.

`LAYERS` is the order of docs/DEVELOPMENT.md's "Layout": no module imports from a layer above
its own, nor from another package of its layer unless `SIDEWAYS` gives the reason. The core
decides from numbers only (no network, no event loop, no clock of its own); the config package
only parses and matches rules: both stay importable and testable without the rest. The settings
stop at app/ and cli/: every package below takes typed options of its own.
"""

from __future__ import annotations

from pathlib import Path

import ratelimit_sidecar
from harness.imports import ImportGraph, find_cycle, import_cycle, import_graph

PACKAGE_DIR = Path(ratelimit_sidecar.__file__).parent
PACKAGE = PACKAGE_DIR.name
GENERATED = ("_proto",)
# The package's layers, lowest first: a module imports from its own package and from lower
# layers only. Packages sharing a layer do not import each other (but see SIDEWAYS). `<root>` is
# the package's own __init__; the shared low modules import nothing of the package.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("<root>", "_proto", "logs", "periodic", "bind"),
    ("config",),
    ("core",),
    ("metrics",),  # counts what the core decides and labels it by rule: imports config, core
    ("storage",),
    ("overrides",),
    ("service",),
    ("grpc_server", "http_server", "sync", "rules"),
    ("app",),
    ("cli",),
    ("__main__",),  # `python -m ratelimit_sidecar`: runs the command line
)
# Imports between packages of one layer, each with its reason: none today.
SIDEWAYS: dict[tuple[str, str], str] = {}
# Who may import the settings: the process (app/) and the command line (cli/). Every other
# package takes its own typed options, built from the settings in app/options.py.
SETTINGS_MODULE = f"{PACKAGE}.app.settings"
SETTINGS_READERS = ("app", "cli")
CORE_FORBIDDEN = ("grpc", "redis", "asyncio", "time", "simulator")


def package_of(module: str) -> str | None:
    """The top-level package (or module) of `module` in the package, None outside it."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else "<root>"


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def upward_imports(graph: ImportGraph) -> list[tuple[str, str]]:
    """(module, import) pairs where a module imports from a higher layer, or from another
    package of its own layer without a SIDEWAYS reason."""
    found = []
    for module, names in graph.items():
        here = package_of(module)
        for name in names:
            there = package_of(name)
            if here is None or there is None or there == here:
                continue
            higher = layer_of(there) > layer_of(here)
            sideways = layer_of(there) == layer_of(here) and (here, there) not in SIDEWAYS
            if higher or sideways:
                found.append((module, name))
    return sorted(found)


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


def test_core_imports_no_io() -> None:
    """The core decides from numbers only: no network, no event loop, no clock of its own."""
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    assert forbidden_imports(graph, f"{PACKAGE}.core", CORE_FORBIDDEN) == []


def test_every_package_has_one_layer() -> None:
    """A new package (or top-level module) is placed in LAYERS before it is checked."""
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    packages = {str(package_of(module)) for module in graph} | set(GENERATED)
    placed = [package for layer in LAYERS for package in layer]
    assert sorted(packages - set(placed)) == []
    assert len(placed) == len(set(placed))


def test_no_module_imports_from_a_higher_layer() -> None:
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    assert upward_imports(graph) == []


def test_each_sideways_import_allowed_is_still_made() -> None:
    """An allowed edge no module takes any more leaves the table."""
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    made = {
        (package_of(module), package_of(name)) for module, names in graph.items() for name in names
    }
    assert sorted(set(SIDEWAYS) - made) == []


def test_only_app_and_cli_import_the_settings() -> None:
    """Every other package takes explicit options (bench/, harness/ and tests/ may import the
    settings: they build sidecars as the command line does)."""
    graph = import_graph(PACKAGE_DIR, skip=GENERATED)
    readers = sorted(
        module
        for module, names in graph.items()
        if any(name == SETTINGS_MODULE or name.startswith(SETTINGS_MODULE + ".") for name in names)
        and package_of(module) not in SETTINGS_READERS
    )
    assert readers == []


def test_an_upward_or_sideways_import_is_reported() -> None:
    graph = {
        f"{PACKAGE}.core.limiter": {f"{PACKAGE}.config.model", f"{PACKAGE}.metrics"},
        f"{PACKAGE}.rules.source": {f"{PACKAGE}.http_server.endpoints", "grpc"},
        f"{PACKAGE}.app.sidecar": {f"{PACKAGE}.rules.source", f"{PACKAGE}.app.settings"},
    }
    assert upward_imports(graph) == [
        (f"{PACKAGE}.core.limiter", f"{PACKAGE}.metrics"),
        (f"{PACKAGE}.rules.source", f"{PACKAGE}.http_server.endpoints"),
    ]


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
