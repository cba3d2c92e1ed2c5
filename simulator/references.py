"""The exact reference of each algorithm: one central decision per request, on the true clock.

It is the `exact` baseline (per-request I/O to one counter, the thing the product avoids) and
the yardstick every other system is measured against on the same arrivals (metrics.py). Each
one adapts a module of simulate/exact/ (the rule's definition, written apart from the core) to
one call, `hit(t)`; the fixed window keeps `ExactCounter` (variants.py).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from simulator.exact.sliding_log import ExactSlidingLog
from simulator.exact.sliding_window import ExactSlidingWindow
from simulator.exact.token_bucket import Bucket
from simulator.variants import ExactCounter


class Reference(Protocol):
    def hit(self, t: int) -> bool:
        """Decide one request of one hit at `t` (not before the previous one)."""
        ...


class SlidingWindowReference:
    """`ExactSlidingWindow`'s decision, with its count kept by span as hits are admitted.

    The module's own `count` groups the whole recent log again on every call (a run would take
    minutes); the grouping is the same one (all hits of a span weigh the same), and each span's
    weight is the module's `weight`. tests/unit/simulator/test_references.py checks the two agree.
    """

    def __init__(self, limit: RateLimit) -> None:
        self.exact = ExactSlidingWindow(limit.requests_per_unit, limit.window_ms, limit.spans)
        self.per_span: dict[int, int] = {}  # first ms of a span -> its admitted hits, in order

    def count(self, now: int) -> Fraction:
        self._forget(now)
        weight = self.exact.weight
        return sum((hits * weight(start, now) for start, hits in self.per_span.items()), Fraction())

    def hit(self, t: int) -> bool:
        admitted = self.count(t) + 1 <= self.exact.max_hits
        if admitted:
            start = self.exact.span_of(t)[0]
            self.per_span[start] = self.per_span.get(start, 0) + 1
        return admitted

    def _forget(self, now: int) -> None:
        """Spans whose weight is 0 at `now` weigh 0 ever after (time only moves on)."""
        for start in list(self.per_span):
            if self.exact.weight(start, now) > 0:
                return
            del self.per_span[start]


class TokenBucketReference:
    def __init__(self, limit: RateLimit) -> None:
        self.bucket = Bucket.of(limit)

    def hit(self, t: int) -> bool:
        return self.bucket.take(t, 1).admitted


class SlidingLogReference:
    def __init__(self, limit: RateLimit) -> None:
        self.log = ExactSlidingLog(limit.requests_per_unit, limit.window_ms)

    def hit(self, t: int) -> bool:
        return self.log.hit(t)


class Blocking:
    """A limit with `cooldown:` set (not the fixed window's, which ExactCounter has): a refusal
    blocks the key for the cooldown, as the core does when the count is over for sure."""

    def __init__(self, inner: Reference, cooldown_ms: int) -> None:
        self.inner, self.cooldown_ms, self.blocked_until = inner, cooldown_ms, 0

    def hit(self, t: int) -> bool:
        if t < self.blocked_until:
            return False
        admitted = self.inner.hit(t)
        if not admitted:
            self.blocked_until = t + self.cooldown_ms
        return admitted


def reference_for(limit: RateLimit) -> Reference:
    """The exact reference of `limit`'s algorithm."""
    name = limit.algorithm
    if name is AlgorithmName.FIXED_WINDOW:
        return ExactCounter(limit.requests_per_unit, limit.window_ms, limit.cooldown)
    inner: Reference
    if name is AlgorithmName.SLIDING_WINDOW:
        inner = SlidingWindowReference(limit)
    elif name is AlgorithmName.TOKEN_BUCKET:
        inner = TokenBucketReference(limit)
    else:
        inner = SlidingLogReference(limit)
    return Blocking(inner, limit.cooldown) if limit.cooldown > 0 else inner


def trailing_bound(limit: RateLimit) -> int:
    """The most the exact rule admits in any trailing window: MAX for the window algorithms
    (the sliding window's span weighting may pass it: measured, not assumed); a full bucket
    plus one window's refill for the token bucket."""
    if limit.algorithm is AlgorithmName.TOKEN_BUCKET:
        return limit.capacity + limit.requests_per_unit
    return limit.requests_per_unit
