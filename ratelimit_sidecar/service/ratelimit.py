"""ShouldRateLimit semantics: validate, match descriptors to rules, ask the core, build the answer.

Synchronous and free of I/O: the gRPC servicer calls `decide` on the event loop thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from ratelimit_sidecar.config.matcher import apply_replaces, match
from ratelimit_sidecar.config.model import Domain, RateLimit, Rule, RuleSet, Unit
from ratelimit_sidecar.core import Decision, Hit, Limiter
from ratelimit_sidecar.service.response import (
    ResponseOptions,
    build_response,
    unmatched_response,
)
from ratelimit_sidecar.service.validation import Bounds, validate
from ratelimit_sidecar.wire import RateLimitDescriptor, RateLimitRequest, RateLimitResponse

MAX_OVERRIDES = 1024
_UNITS = frozenset(int(u) for u in Unit if u is not Unit.UNKNOWN)


class DecisionObserver(Protocol):
    """Hook for metrics, called after each decision."""

    def decided(self, domain: str, hits: Sequence[Hit], decision: Decision) -> None: ...

    def unknown_domain(self, domain: str) -> None: ...


class RateLimitHandler:
    """Answers ShouldRateLimit from the current rules and the limiter."""

    def __init__(
        self,
        rules: RuleSet,
        limiter: Limiter,
        clock_ms: Callable[[], int],
        *,
        bounds: Bounds | None = None,
        options: ResponseOptions | None = None,
        observer: DecisionObserver | None = None,
    ) -> None:
        self.rules = rules  # replaced whole on reload: one attribute store, no lock needed
        self.limiter = limiter
        self._clock_ms = clock_ms
        self._bounds = bounds or Bounds()
        self._options = options or ResponseOptions()
        self._observer = observer
        self._overrides: dict[tuple[Rule, int, int], Rule] = {}

    def swap_rules(self, rules: RuleSet) -> None:
        """One attribute store: a request sees the old rules or the new, never a mix."""
        self._overrides = {}
        self.rules = rules

    def decide(self, request: RateLimitRequest) -> RateLimitResponse:
        """Raises InvalidRequest for a request that cannot be answered."""
        validate(request, self._bounds)
        domain = self.rules.domain(request.domain)
        if domain is None:
            if self._observer is not None:
                self._observer.unknown_domain(request.domain)
            return unmatched_response(len(request.descriptors))
        default_hits = request.hits_addend or 1
        matched = [self._rule(domain, d) for d in request.descriptors]
        rules = apply_replaces(matched) if len(matched) > 1 else matched
        hits = [
            Hit(rule, _key(request.domain, d, rule), _hits(d, default_hits))
            for rule, d in zip(rules, request.descriptors, strict=True)
        ]
        decision = self.limiter.hit(self._clock_ms(), hits)
        if self._observer is not None:
            self._observer.decided(request.domain, hits, decision)
        return build_response(decision, self._options)

    def _rule(self, domain: Domain, descriptor: RateLimitDescriptor) -> Rule | None:
        rule = match(domain, [(e.key, e.value) for e in descriptor.entries])
        if rule is not None and descriptor.HasField("limit") and descriptor.limit.unit in _UNITS:
            return self._override(rule, descriptor.limit.requests_per_unit, descriptor.limit.unit)
        return rule

    def _override(self, rule: Rule, requests_per_unit: int, unit: int) -> Rule:
        """The request carries its own limit (RateLimitOverride): same rule, other numbers."""
        cache_key = (rule, requests_per_unit, unit)
        found = self._overrides.get(cache_key)
        if found is None:
            if len(self._overrides) >= MAX_OVERRIDES:
                self._overrides.clear()
            base = rule.limit or RateLimit(requests_per_unit, Unit(unit))
            limit = replace(base, requests_per_unit=requests_per_unit, unit=Unit(unit))
            found = replace(rule, limit=limit, unlimited=False)
            self._overrides[cache_key] = found
        return found


def _key(domain: str, descriptor: RateLimitDescriptor, rule: Rule | None) -> tuple[str, ...]:
    """The counter's identity: the domain and every entry, one counter per distinct value.

    A wildcard with `share_threshold` counts all matching values together, so at those levels
    the configured pattern stands in for the request's value.
    """
    flat = [domain]
    for entry in descriptor.entries:
        flat.append(entry.key)
        flat.append(entry.value)
    if rule is not None and rule.shared_levels:
        for level in rule.shared_levels:
            flat[2 + 2 * level] = rule.path[level][1]
    return tuple(flat)


def _hits(descriptor: RateLimitDescriptor, default: int) -> int:
    """A descriptor's own hits_addend wins (0 = check only); else the request's, where 0 is 1.

    `is_negative_hits` gives quota back: the hits are subtracted from the counter.
    """
    hits = descriptor.hits_addend.value if descriptor.HasField("hits_addend") else default
    return -hits if descriptor.is_negative_hits else hits
