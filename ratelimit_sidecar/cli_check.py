"""`ratelimit-sidecar check PATH`: validate rule files the way `serve` would load them."""

from __future__ import annotations

import sys

from .config import ConfigError, load_rules


def run_check(path: str) -> int:
    """Print one summary line and return 0, or print each problem to stderr and return 1."""
    try:
        rules = load_rules(path)
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
