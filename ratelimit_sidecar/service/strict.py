"""Requests with strict limits: the strict ones checked on Redis, the rest from memory.

Strict limits go first (one script call per hash slot, bounded by `--strict-timeout-ms`); if one
refuses, the eventual hits are only checked, not counted (`Limiter.hit`, `refused`). Strict limits
Redis admitted stay counted even if an eventual one then refuses: the store call cannot wait for
memory (the reference counts every descriptor it checks too). When the store fails or the breaker
is open, each strict limit applies `on_store_failure`: `local` decides from memory with an
eventual twin (same key, so its counts reach Redis by the sync; a log's twin is a sliding
window), `allow` admits, `deny` refuses until the breaker retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, StoreFailure
from ratelimit_sidecar.core import Code, Decision, Hit, Limiter, Verdict
from ratelimit_sidecar.core.breaker import Breaker
from ratelimit_sidecar.core.limiter import limit_key, refusal_order
from ratelimit_sidecar.core.verdicts import refusal
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck

MAX_CACHED_RULES = 10_000
# Results of one request's strict checks, as metrics label them.
ADMITTED, OVER_LIMIT, FAILED, BREAKER_OPEN = "admitted", "over_limit", "failed", "breaker_open"


class StrictChecker(Protocol):
    async def check(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]: ...


class StrictObserver(Protocol):
    def strict_checked(self, result: str, seconds: float) -> None: ...


class Part(NamedTuple):
    """A piece of a descriptor's answer: index of a strict check or of an eventual hit."""

    descriptor: int
    strict: bool
    at: int  # index into the plan's checks (strict) or eventual hits


class Plan(NamedTuple):
    """Per check: its rule, the limit's position in it, its part's index."""

    checks: list[StrictCheck]
    eventual: list[Hit]
    parts: list[Part]
    origins: list[tuple[Rule, int, int]]


def has_strict(hits: Sequence[Hit]) -> bool:
    return any(h.rule is not None and any(lim.strict for lim in h.rule.limits) for h in hits)


class StrictDecider:
    def __init__(
        self,
        limiter: Limiter,
        store: StrictChecker,
        *,
        timeout_ms: int,
        breaker: Breaker | None = None,
        observer: StrictObserver | None = None,
    ) -> None:
        self.limiter = limiter
        self.store = store
        self.timeout_s = timeout_ms / 1000
        self.breaker = breaker or Breaker()
        self._observer = observer
        self._single: dict[tuple[Rule, int, bool], Rule] = {}  # a limit alone, or its twin

    async def decide(self, now_ms: int, hits: Sequence[Hit]) -> Decision:
        plan = self.split(hits)
        answers = await self._ask(plan.checks, now_ms)
        strict: list[Verdict | None] = []
        for index, answer in enumerate(answers):
            verdict = self._strict_verdict(plan.checks[index], answer, now_ms)
            if verdict is None:  # no store answer, on_store_failure local: the twin decides
                rule, position, part = plan.origins[index]
                plan.parts[part] = Part(plan.parts[part].descriptor, False, len(plan.eventual))
                check = plan.checks[index]
                twin = self._single_rule(rule, position, check.limit, twin=True)
                plan.eventual.append(Hit(twin, check.key, check.hits))
            strict.append(verdict)
        refused = any(v is not None and v.code is Code.OVER_LIMIT for v in strict)
        decided = self.limiter.hit(now_ms, plan.eventual, refused).verdicts
        return merge(len(hits), plan.parts, strict, decided)

    # -- splitting ---------------------------------------------------------------------------

    def split(self, hits: Sequence[Hit]) -> Plan:
        plan = Plan([], [], [], [])
        for descriptor, hit in enumerate(hits):
            rule = hit.rule
            if rule is None or not any(lim.strict for lim in rule.limits):
                plan.parts.append(Part(descriptor, False, len(plan.eventual)))
                plan.eventual.append(hit)
                continue
            alone = len(rule.limits) == 1
            for index, limit in enumerate(rule.limits):
                key = hit.key if alone else limit_key(hit.key, index)
                if limit.strict and limit.requests_per_unit > 0:
                    # Global shadow mode settles the overall code later (service/overall.py).
                    plan.origins.append((rule, index, len(plan.parts)))
                    plan.parts.append(Part(descriptor, True, len(plan.checks)))
                    plan.checks.append(StrictCheck(key, limit, hit.hits, rule.shadow_mode))
                else:  # an eventual limit of the descriptor (or a deny-all: no store needed)
                    plan.parts.append(Part(descriptor, False, len(plan.eventual)))
                    single = self._single_rule(rule, index, limit)
                    plan.eventual.append(Hit(single, key, hit.hits))
        return plan

    def _single_rule(self, rule: Rule, index: int, limit: RateLimit, twin: bool = False) -> Rule:
        """`rule` with one limit (or its twin), the same object each time: the counts are kept."""
        found = self._single.get((rule, index, twin))
        if found is None:
            if len(self._single) >= MAX_CACHED_RULES:
                self._single.clear()
            limit = eventual_twin(limit) if twin else limit
            found = replace(rule, limit=limit, limits=(limit,))
            self._single[(rule, index, twin)] = found
        return found

    # -- the store ---------------------------------------------------------------------------

    async def _ask(self, checks: list[StrictCheck], now_ms: int) -> list[StrictAnswer | None]:
        """None each when the store failed or was not asked."""
        if not checks:
            return []
        if not self.breaker.allow(now_ms):
            self._observe(BREAKER_OPEN, 0.0)
            return [None] * len(checks)
        started = time.perf_counter()
        try:
            answers = await asyncio.wait_for(self.store.check(checks), self.timeout_s)
        except Exception:  # any failure, timeouts included: on_store_failure decides
            self.breaker.failed(now_ms)
            self._observe(FAILED, time.perf_counter() - started)
            return [None] * len(checks)
        self.breaker.succeeded()
        refused = any(not a.fits and not c.shadow for c, a in zip(checks, answers, strict=True))
        self._observe(OVER_LIMIT if refused else ADMITTED, time.perf_counter() - started)
        return list(answers)

    def _observe(self, result: str, seconds: float) -> None:
        if self._observer is not None:
            self._observer.strict_checked(result, seconds)

    def _strict_verdict(
        self, check: StrictCheck, answer: StrictAnswer | None, now_ms: int
    ) -> Verdict | None:
        if answer is not None:
            return answer_verdict(check, answer)
        policy = check.limit.on_store_failure
        if policy is StoreFailure.LOCAL:
            return None
        if policy is StoreFailure.ALLOW:
            remaining = max(0, check.limit.capacity - max(0, check.hits))
            return Verdict(Code.OK, check.limit, remaining=remaining, shadow=check.shadow)
        wait = self.breaker.retry_in_ms(now_ms) or self.breaker.open_ms
        return refusal(check.limit, check.shadow, wait)


def eventual_twin(limit: RateLimit) -> RateLimit:
    """A sliding log has no eventual form: a sliding window."""
    log = limit.algorithm is AlgorithmName.SLIDING_LOG
    return replace(
        limit, strict=False, algorithm=AlgorithmName.SLIDING_WINDOW if log else limit.algorithm
    )


def answer_verdict(check: StrictCheck, answer: StrictAnswer) -> Verdict:
    if not answer.fits:
        return refusal(check.limit, check.shadow, answer.reset_ms)
    limit = check.limit
    near = answer.remaining <= (1 - limit.near_limit_ratio) * limit.capacity
    return Verdict(
        Code.OK, limit, False, answer.remaining, answer.reset_ms, False, check.shadow, near
    )


def merge(
    descriptors: int,
    parts: Sequence[Part],
    strict: Sequence[Verdict | None],
    eventual: Sequence[Verdict],
) -> Decision:
    """As the limiter answers several limits: a refusal (the longest), else the fewest remaining."""
    per_descriptor: list[list[Verdict]] = [[] for _ in range(descriptors)]
    for part in parts:
        verdict = strict[part.at] if part.strict else eventual[part.at]
        assert verdict is not None
        per_descriptor[part.descriptor].append(verdict)
    verdicts = tuple(_combine(found) for found in per_descriptor)
    over = any(v.code is Code.OVER_LIMIT for v in verdicts)
    return Decision(Code.OVER_LIMIT if over else Code.OK, verdicts)


def _combine(verdicts: list[Verdict]) -> Verdict:
    if len(verdicts) == 1:
        return verdicts[0]
    refusals = [v for v in verdicts if v.code is Code.OVER_LIMIT or v.shadow_refused]
    if refusals:
        return max(refusals, key=refusal_order)
    return min(verdicts, key=lambda verdict: verdict.remaining)
