"""The runtime overrides in force, as the request path looks them up.

Replaced whole when the set changes: a request sees the old or the new, never a mix. Consulted
only when a request is compiled, so a repeated request pays nothing for the set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.overrides.model import Entries, Override


@dataclass(frozen=True, slots=True)
class AppliedOverrides:
    """`domains`: those with an override (known to the service without a rule file)."""

    rules: Mapping[tuple[str, Entries], Rule] = field(default_factory=lambda: MappingProxyType({}))
    domains: frozenset[str] = frozenset()
    version: int = 0

    @classmethod
    def of(cls, overrides: Iterable[Override], version: int) -> AppliedOverrides:
        rules = {(o.domain, o.entries): o.rule for o in overrides}
        domains = frozenset(domain for domain, _ in rules)
        return cls(MappingProxyType(rules), domains, version)

    def rule(self, domain: str, entries: Entries, fallback: Rule | None) -> Rule | None:
        return self.rules.get((domain, entries), fallback)


NO_OVERRIDES = AppliedOverrides()
