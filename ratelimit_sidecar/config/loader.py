"""Load rule YAML in the format of `envoyproxy/ratelimit` into the frozen model.

`load_rules(path)` takes a YAML file or a directory of `*.yaml` / `*.yml` (not recursive; hidden
files such as Kubernetes' `..data` skipped), one domain per file, and raises one `ConfigError`
listing every problem (past a `ConfigLimits` bound at once).

Every problem prints as `FILE:LINE: KEY: MESSAGE`: LINE is 1-based at the offending key (0:
unreadable file); KEY is the dotted path with list indexes, `descriptors[0].rate_limit.unit` (a
missing key: the path it should have, at its mapping's line), or `file`, `yaml`, `(root)`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from .errors import ConfigError, Problem
from .limits import (
    DEFAULT_LIMITS,
    ConfigLimits,
    DescriptorBudget,
    LimitExceeded,
    LoadStopped,
    Pacer,
    check_total_size,
    collector_paused,
    never_stopped,
    read_bounded,
)
from .model import DEFAULT_RULES, Domain, RuleDefaults, RuleSet
from .rulefile import RuleFileReader


def load_rules(
    path: str | Path,
    limits: ConfigLimits = DEFAULT_LIMITS,
    stopped: Callable[[], bool] = never_stopped,
    defaults: RuleDefaults = DEFAULT_RULES,
) -> RuleSet:
    """`stopped` (asked about once a ms) ends a load nobody waits for with `LoadStopped`."""
    problems: list[Problem] = []
    loaded: tuple[dict[str, Domain], str] | None = ({}, "")
    with collector_paused():  # caught inside, tracebacks and half-built trees are freed by
        try:  # reference counting instead of being scanned by the collector
            loaded = _load(Path(path), limits, Pacer(stopped), problems, defaults)
        except LimitExceeded as exc:
            problems.append(exc.problem)
        except LoadStopped:
            loaded = None
    if loaded is None:
        raise LoadStopped
    if problems:
        raise ConfigError(problems)
    domains, version = loaded
    return RuleSet(MappingProxyType(domains), version=version)


def _load(
    path: Path, limits: ConfigLimits, pacer: Pacer, problems: list[Problem], defaults: RuleDefaults
) -> tuple[dict[str, Domain], str]:
    files = _rule_files(path, problems)
    if path.is_dir():
        check_total_size(path, files, limits.max_rule_dir_bytes)
    digest = hashlib.sha256()
    domains: dict[str, Domain] = {}
    budget = DescriptorBudget(limits.max_rule_descriptors, pacer)
    for file in files:
        try:
            data = read_bounded(file, limits.max_rule_file_bytes)
        except OSError as exc:
            problems.append(Problem(str(file), 0, "file", exc.strerror or str(exc)))
            continue
        # Name and length go in too, so moving bytes between files changes the version.
        digest.update(b"%s\0%d\0" % (file.name.encode(), len(data)) + data)
        reader = RuleFileReader(str(file), budget, limits.max_yaml_nodes, defaults)
        domain = reader.load(data)
        # Checks run key by key, not in file order; sort so the report reads top to bottom.
        problems.extend(sorted(reader.problems, key=lambda problem: problem.line))
        if domain is not None:
            _add_domain(domains, domain, problems)
    return domains, digest.hexdigest()[:12]


def _add_domain(domains: dict[str, Domain], domain: Domain, problems: list[Problem]) -> None:
    first = domains.setdefault(domain.name, domain)
    if first is not domain:
        message = f"duplicate domain '{domain.name}' (already defined at {first.source})"
        problems.append(Problem(domain.source.file, domain.source.line, "domain", message))


def _rule_files(path: Path, problems: list[Problem]) -> list[Path]:
    try:
        if path.is_dir():
            found = [p for p in path.iterdir() if _is_rule_file(p)]
            return sorted(found, key=lambda p: p.name)
        if path.exists():
            return [path]
    except OSError as exc:
        problems.append(Problem(str(path), 0, "file", exc.strerror or str(exc)))
        return []
    problems.append(Problem(str(path), 0, "file", "no such file or directory"))
    return []


def _is_rule_file(path: Path) -> bool:
    return not path.name.startswith(".") and path.suffix in (".yaml", ".yml") and path.is_file()
