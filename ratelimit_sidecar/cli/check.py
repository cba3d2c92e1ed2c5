"""`ratelimit-sidecar check PATH`: validate rule files the way `serve` would load them.

It takes the same limit options as `serve` (`--max-rule-file-bytes`, ...), so a file `check`
accepts is one `serve` accepts with the same flags or `RLS_*` variables.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ratelimit_sidecar.config import ConfigError, load_rules
from ratelimit_sidecar.config.limits import DEFAULT_LIMITS, LIMIT_NAMES, ConfigLimits


def limits_from(values: Mapping[str, Any]) -> ConfigLimits:
    """The limits among parsed option `values`; a missing or None value keeps the default."""
    given = {name: values[name] for name in LIMIT_NAMES if values.get(name) is not None}
    return ConfigLimits(**given)


def run_check(path: str, limits: ConfigLimits = DEFAULT_LIMITS) -> int:
    """Print one summary line and return 0, or print each problem to stderr and return 1."""
    try:
        rules = load_rules(path, limits)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    domains = len(rules.domains)
    count = sum(len(domain.rules()) for domain in rules.domains.values())
    print(
        f"OK: {domains} {_plural(domains, 'domain')}, {count} {_plural(count, 'rule')}"
        f" (version {rules.version})"
    )
    return 0


def _plural(count: int, noun: str) -> str:
    return noun if count == 1 else f"{noun}s"
