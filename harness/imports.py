"""Which modules of a package import which, read from the source with `ast` (nothing is run).

Every import counts: top level, inside functions and under `if TYPE_CHECKING`. An import of
`pkg.a.b` is an edge to `pkg.a.b` only, not to the packages `pkg` and `pkg.a` that Python also
initialises on the way: those are loaded first and never form a cycle by themselves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ImportGraph = dict[str, set[str]]  # module -> every name it imports (package modules resolved)


def module_files(package_dir: Path, skip: Iterable[str] = ()) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `package_dir` outside the `skip` folders."""
    skipped = set(skip)
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if skipped.intersection(parts[:-1]):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package_dir.name, *parts))] = path
    return found


def imported_names(module: str, path: Path, modules: Iterable[str]) -> set[str]:
    """Every module `module` imports; `from a import b` names `a.b` when that is a module."""
    known = set(modules)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.module or "", node.level)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                names.add(child if child in known else base)
    return names


def import_graph(package_dir: Path, skip: Iterable[str] = ()) -> ImportGraph:
    """Every module of the package and the names it imports (inside and outside the package)."""
    files = module_files(package_dir, skip)
    return {module: imported_names(module, path, files) for module, path in files.items()}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 while on the current path, 2 when fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(set(graph[module]) & graph.keys()):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def import_cycle(package_dir: Path, skip: Iterable[str] = ()) -> list[str] | None:
    """One import cycle among the modules of the package at `package_dir`, or None."""
    return find_cycle(import_graph(package_dir, skip))


def _absolute(package: str, module: str, level: int) -> str:
    if level == 0:
        return module
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base
