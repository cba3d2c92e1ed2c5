"""Load rule YAML in the format of `envoyproxy/ratelimit` into the frozen model of `model.py`.

`load_rules(path)` takes one YAML file or a directory of `*.yaml` / `*.yml` files (not recursive;
hidden files such as Kubernetes' `..data` links are skipped), one domain per file, and returns a
`RuleSet` or raises one `ConfigError` listing every problem found. Loading stays within
`ConfigLimits` (`limits.py`): past a bound it stops at once and reports that one problem with
those found before it.

Error convention: every problem prints as `FILE:LINE: KEY: MESSAGE` where
    FILE is the path as given (or the directory joined with the file name),
    LINE is 1-based, pointing at the offending key or value (0 = the file could not be read),
    KEY  is the dotted YAML path from the top of the file, with list indexes in brackets:
         `descriptors[0].descriptors[1].rate_limit.unit`. A missing key is reported under the path
         it should have had, at the line of the mapping that lacks it. Problems that are not about
         one key use `file` (unreadable, too big), `yaml` (syntax, too many nodes) or `(root)`
         (the document itself).
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
    """Parse and validate every rule file under `path`; raise `ConfigError` on any problem.

    `stopped` is asked about once a millisecond; once it says true the load ends with
    `LoadStopped` (for a load in a thread that nobody waits for any more).
    """
    problems: list[Problem] = []
    with collector_paused():
        loaded = _load_within_limits(Path(path), limits, Pacer(stopped), problems, defaults)
    if loaded is None:
        raise LoadStopped
    if problems:
        raise ConfigError(problems)
    domains, version = loaded
    return RuleSet(MappingProxyType(domains), version=version)


def _load_within_limits(
    path: Path,
    limits: ConfigLimits,
    pacer: Pacer,
    problems: list[Problem],
    defaults: RuleDefaults,
) -> tuple[dict[str, Domain], str] | None:
    """`_load`, or None if stopped. A passed limit ends in `problems` instead of an exception:
    caught here, its traceback and the half-built trees it holds are freed by reference counting
    before the collector runs again, instead of being scanned by it."""
    try:
        return _load(path, limits, pacer, problems, defaults)
    except LimitExceeded as exc:
        problems.append(exc.problem)
        return {}, ""
    except LoadStopped:
        return None


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
    first = domains.get(domain.name)
    if first is None:
        domains[domain.name] = domain
        return
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
