"""ShouldRateLimit semantics: validate, match descriptors to rules, ask the core, build the answer.

Free of I/O: a transport calls `respond_now` on the event loop thread with the request's wire
bytes, and gets the response's. What the bytes mean is worked out once per distinct request
(`service.compiled`), so a repeated request costs a lookup, the limiter and the encoder. The one
exception is a request with a strict limit (when a store is configured): `respond_now` raises
StoreNeeded and `respond_strict` awaits the store (`service.strict`: one Redis call per slot).
`respond` does both, for callers that can always await. A request with one counted descriptor
takes the fast path (`service.fast_path`) until it is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from sys import intern

from google.protobuf.message import DecodeError

from ratelimit_sidecar._proto.wire import RateLimitDescriptor, RateLimitRequest
from ratelimit_sidecar.config.matcher import apply_replaces, match
from ratelimit_sidecar.config.model import Domain, RateLimit, Rule, RuleSet, Unit
from ratelimit_sidecar.core import Decision, Hit, Limiter, Verdict, unlimited_verdict
from ratelimit_sidecar.core.types import OVER_LIMIT
from ratelimit_sidecar.overrides.applied import NO_OVERRIDES, AppliedOverrides
from ratelimit_sidecar.service.compiled import DEFAULT_MAX_ENTRIES, CompiledRequest, RequestCache
from ratelimit_sidecar.service.dynamic_metadata import dynamic_metadata_field
from ratelimit_sidecar.service.fast_path import FastPath, OneCounted
from ratelimit_sidecar.service.observer import DecisionObserver
from ratelimit_sidecar.service.overall import OverallCode
from ratelimit_sidecar.service.response import (
    ResponseEncoder,
    ResponseOptions,
    unmatched_response,
)
from ratelimit_sidecar.service.strict import StrictDecider, has_strict
from ratelimit_sidecar.service.validation import (
    Bounds,
    Entries,
    InvalidRequest,
    validate_entries,
    validate_request,
)

MAX_REQUEST_LIMITS = 1024  # rules made for limits requests carry, kept at most
MAX_HITS = 2**32 - 1
_UNITS = frozenset(int(u) for u in Unit if u is not Unit.UNKNOWN)


class StoreNeeded(Exception):
    """`respond_now` cannot answer `compiled` from memory: a strict limit waits for the store."""

    def __init__(self, compiled: CompiledRequest) -> None:
        super().__init__(compiled.domain)
        self.compiled = compiled


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
        cache_entries: int = DEFAULT_MAX_ENTRIES,
        strict: StrictDecider | None = None,
        fast_path: bool = True,
    ) -> None:
        """`fast_path` False: every request takes the general path (tests compare the two)."""
        self.rules = rules  # replaced whole on reload: one attribute store, no lock needed
        self.limiter = limiter
        self._clock_ms = clock_ms
        self._bounds = bounds or Bounds()
        self._encoder = ResponseEncoder(options)
        self._observer = observer
        self._fast_path = FastPath(limiter, self._encoder, observer, enabled=fast_path)
        self._request_limits: dict[tuple[object, int, int], Rule] = {}
        self._compiled = RequestCache(cache_entries)
        self._strict = strict  # None: strict rules are decided by the limiter (local-only)
        options = self._encoder.options
        self._overall = OverallCode(
            limiter,
            shadow_mode=options.shadow_mode,
            quota_mode=options.quota_mode,
            strict_in_store=strict is not None,
        )
        self._metadata = options.dynamic_metadata
        self._refusals_may_pass = _lets_refusals_through(rules, options)
        # Runtime overrides (admin API): replaced whole, kept across rule reloads.
        self.api_overrides = NO_OVERRIDES

    def swap_rules(self, rules: RuleSet) -> None:
        """One attribute store: a request sees the old rules or the new, never a mix."""
        self._request_limits = {}
        self._compiled.clear()
        self._refusals_may_pass = _lets_refusals_through(rules, self._encoder.options)
        self.rules = rules

    def swap_overrides(self, applied: AppliedOverrides) -> None:
        """The runtime overrides changed: requests are matched afresh (counters stay)."""
        self._request_limits = {}
        self._compiled.clear()
        self.api_overrides = applied

    def respond_now(self, raw: bytes) -> bytes:
        """The encoded RateLimitResponse to an encoded RateLimitRequest, decided from memory.
        Raises StoreNeeded for a request with a strict limit (`respond` awaits the store for it),
        InvalidRequest for one that cannot be answered (malformed, empty, too big)."""
        compiled = self._compiled.get(raw) or self._compile(raw)
        if isinstance(compiled, OneCounted):  # the fast path; a refusal comes back decided
            now = self._clock_ms()
            fast = self._fast_path.answer(now, compiled)
            return fast if isinstance(fast, bytes) else self._response(now, raw, compiled, fast)
        if not compiled.known:
            return self._unknown(raw, compiled)
        if compiled.strict:
            raise StoreNeeded(compiled)
        now = self._clock_ms()
        return self._response(now, raw, compiled, self.limiter.hit(now, compiled.hits))

    async def respond(self, raw: bytes) -> bytes:
        """`respond_now`, and for a request with a strict limit its answer after the store's."""
        try:
            return self.respond_now(raw)
        except StoreNeeded as needed:
            return await self.respond_strict(raw, needed.compiled)

    async def respond_strict(self, raw: bytes, compiled: CompiledRequest) -> bytes:
        """The answer to a request `respond_now` raised StoreNeeded for: the store decides."""
        assert self._strict is not None
        now = self._clock_ms()
        decision = await self._strict.decide(now, compiled.hits)
        return self._response(now, raw, compiled, decision)

    def _unknown(self, raw: bytes, compiled: CompiledRequest) -> bytes:
        """Every descriptor OK: the domain has no rules."""
        if self._observer is not None:
            self._observer.unknown_domain(compiled.domain)
        unmatched = unmatched_response(len(compiled.hits))
        if self._metadata:
            return self._with_metadata(unmatched, raw, compiled.hits, ())
        return unmatched

    def _response(
        self, now: int, raw: bytes, compiled: CompiledRequest, decision: Decision
    ) -> bytes:
        """The response to a decided request: the overall code, metrics, the encoding."""
        if decision.code is OVER_LIMIT and self._refusals_may_pass:  # quota or shadow mode
            decision = self._overall.settle(now, compiled.hits, decision)
        if self._observer is not None and compiled.tally is not None:
            self._observer.decided(compiled.tally, decision)
        response = self._encoder.encode(decision)
        if self._metadata:
            return self._with_metadata(response, raw, compiled.hits, decision.verdicts)
        return response

    def _with_metadata(
        self, response: bytes, raw: bytes, hits: Sequence[Hit], verdicts: Sequence[Verdict]
    ) -> bytes:
        """`response` with the reference's dynamic metadata; the request is parsed again (an
        opt-in setting: the compiled request keeps no copy of what only it needs)."""
        request = RateLimitRequest.FromString(raw)
        verdicts = verdicts or [unlimited_verdict(hit.rule) for hit in hits]
        return response + dynamic_metadata_field(request, hits, verdicts)

    def _compile(self, raw: bytes) -> CompiledRequest:
        """Parse, validate and match a request not seen since the rules last changed."""
        try:
            request = RateLimitRequest.FromString(raw)
        except DecodeError as exc:
            raise InvalidRequest(f"malformed RateLimitRequest: {exc}") from None
        name, descriptors = intern(request.domain), request.descriptors  # one str for all keys
        validate_request(name, len(descriptors), self._bounds)
        domain = self.rules.domain(name)
        known = domain is not None or name in self.api_overrides.domains
        default_hits = request.hits_addend or 1
        # One pass over each descriptor's entries: validate, match, and name the counter.
        hits = [
            self._hit(name, domain, i, d, default_hits, known=known)
            for i, d in enumerate(descriptors)
        ]
        if len(hits) > 1 and known:
            hits = _apply_replaces(hits)
        tally = None if self._observer is None else self._observer.tally(name, hits)
        strict = known and self._strict is not None and has_strict(hits)
        fast = self._fast_path.compile(name, tuple(hits), tally) if known and not strict else None
        compiled = fast or CompiledRequest(name, tuple(hits), known, tally, strict)
        self._compiled.put(raw, compiled)
        return compiled

    def _hit(
        self,
        name: str,
        domain: Domain | None,
        index: int,
        descriptor: RateLimitDescriptor,
        default_hits: int,
        *,
        known: bool,
    ) -> Hit:
        entries = [(intern(e.key), e.value) for e in descriptor.entries]
        validate_entries(index, entries, self._bounds)
        rule = self._rule(name, domain, entries, descriptor) if known else None
        return Hit(rule, _key(name, entries, rule), _hits(descriptor, default_hits))

    def _rule(
        self, name: str, domain: Domain | None, entries: Entries, descriptor: RateLimitDescriptor
    ) -> Rule | None:
        """Precedence: the request's own limit > a runtime override > the rule files."""
        rule = None if domain is None else match(domain, entries)
        if self.api_overrides.rules:
            rule = self.api_overrides.rule(name, tuple(entries), rule)
        if descriptor.HasField("limit") and descriptor.limit.unit in _UNITS:
            override = descriptor.limit.requests_per_unit, descriptor.limit.unit
            return self._request_limit(rule or _unmatched(name, entries), *override)
        return rule

    def _request_limit(self, rule: Rule, requests_per_unit: int, unit: int) -> Rule:
        """The request carries its own limit (RateLimitOverride), in any descriptor of a known
        domain, matched or not: the rule's counter with other numbers. As in the reference, an
        override is enforced and counted alone: no shadow or quota mode, no metadata."""
        # A loaded rule is its own key; a rule made for an unmatched descriptor is new each time.
        made = rule.source is None
        cache_key = ((rule.domain, rule.path) if made else rule, requests_per_unit, unit)
        found = self._request_limits.get(cache_key)
        if found is None:
            if len(self._request_limits) >= MAX_REQUEST_LIMITS:
                self._request_limits.clear()
            base = rule.limit or RateLimit(requests_per_unit, Unit(unit))
            # The override's window is its unit alone (it carries no multiplier).
            limit = replace(
                base, requests_per_unit=requests_per_unit, unit=Unit(unit), unit_multiplier=1
            )
            found = replace(
                rule,
                limit=limit,
                limits=(limit,),
                unlimited=False,
                shadow_mode=False,
                quota_mode=False,
                metadata=None,
            )
            self._request_limits[cache_key] = found
        return found


def _unmatched(domain: str, entries: Entries) -> Rule:
    """What an override applies to when no rule matches: a rule of its own, named by the
    request's keys alone (values are the client's: a label per value would be unbounded)."""
    return Rule(domain=domain, path=tuple((key, "") for key, _ in entries))


def _lets_refusals_through(rules: RuleSet, options: ResponseOptions) -> bool:
    """Whether a refused request may still be answered OK (service/overall.py): otherwise the
    refusals, a flood's answers, skip that check."""
    return options.shadow_mode or options.quota_mode or rules.has_quota_mode


def _apply_replaces(hits: list[Hit]) -> list[Hit]:
    rules = apply_replaces([hit.rule for hit in hits])
    return [
        hit if rule is hit.rule else hit._replace(rule=rule)
        for hit, rule in zip(hits, rules, strict=True)
    ]


def _key(domain: str, entries: Entries, rule: Rule | None) -> tuple[str, ...]:
    """The counter's identity: the domain and every entry, one counter per distinct value. A
    wildcard with `share_threshold` counts all matching values together, so at those levels the
    configured pattern stands in for the request's value."""
    flat = [domain]
    for key, value in entries:
        flat.append(key)
        flat.append(value)
    if rule is not None and rule.shared_levels:
        for level in rule.shared_levels:
            flat[2 + 2 * level] = rule.path[level][1]
    return tuple(flat)


def _hits(descriptor: RateLimitDescriptor, default: int) -> int:
    """Its own hits_addend (0: a check), else the request's (0 is 1); is_negative_hits gives back"""
    hits = descriptor.hits_addend.value if descriptor.HasField("hits_addend") else default
    hits = min(hits, MAX_HITS)  # more than any limit admits: the protocol's uint32 range
    return -hits if descriptor.is_negative_hits else hits
