"""The runtime overrides in force, as the request path looks them up.

One frozen object, replaced whole when the set changes (`RateLimitHandler.swap_overrides`): a
request sees the old set or the new, never a mix. It is consulted only when a request is
compiled (once per distinct request bytes, service/compiled.py), so the set costs a repeated
request nothing, whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.config.overrides import Entries, Override


@dataclass(frozen=True, slots=True)
class AppliedOverrides:
    """The rule each overridden (domain, descriptor) gets, and the domains that have one (a
    domain without a rule file is known to the service while an override names it)."""

    rules: Mapping[tuple[str, Entries], Rule] = field(default_factory=lambda: MappingProxyType({}))
    domains: frozenset[str] = frozenset()
    version: int = 0

    @classmethod
    def of(cls, overrides: Iterable[Override], version: int) -> AppliedOverrides:
        rules = {(o.domain, o.entries): o.rule for o in overrides}
        domains = frozenset(domain for domain, _ in rules)
        return cls(MappingProxyType(rules), domains, version)

    def rule(self, domain: str, entries: Entries, fallback: Rule | None) -> Rule | None:
        """The override's rule for exactly these entries, else `fallback` (the files')."""
        return self.rules.get((domain, entries), fallback)


NO_OVERRIDES = AppliedOverrides()
