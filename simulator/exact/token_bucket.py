"""An exact token bucket, as the textbook states it: a level of tokens that refills continuously.

Written apart from core/token_bucket.py (which keeps a theoretical arrival time instead) so that
each checks the other. The level is a `Fraction`: no rounding anywhere, so every decision, every
count of tokens left and every wait is the exact one. One bucket per key; the bucket starts full.

A request of n hits at t: the level first refills by (t - last) x requests_per_unit / window_ms,
up to the capacity. The request is admitted if n tokens are there, and takes them; n <= 0
takes nothing (a negative n gives tokens back, up to the capacity). Admitted: `remaining` is the
whole tokens left, `reset_ms` the whole ms until the bucket is full. Refused: `reset_ms` is the
whole ms until n tokens are there (until the bucket is full when n is more than it ever holds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.types import KeyId


class Answer(NamedTuple):
    admitted: bool
    remaining: int  # whole tokens left (0 when refused)
    reset_ms: int  # admitted: until full; refused: until the request's tokens are there


@dataclass(slots=True)
class Bucket:
    """One key's bucket, as `capacity` tokens refilled at `per_ms` tokens a ms."""

    capacity: int
    per_ms: Fraction
    level: Fraction = Fraction(0)
    last_ms: int | None = None

    @classmethod
    def of(cls, limit: RateLimit) -> Bucket:
        per_ms = Fraction(limit.requests_per_unit, limit.window_ms)
        return cls(limit.capacity, per_ms, Fraction(limit.capacity))

    def take(self, now_ms: int, hits: int) -> Answer:
        self._refill(now_ms)
        if hits > self.level:
            needed = hits if hits <= self.capacity else self.capacity
            return Answer(False, 0, self._ms_until(needed))
        self.level = min(Fraction(self.capacity), self.level - hits)  # hits < 0: given back
        return Answer(True, math.floor(self.level), self._ms_until(self.capacity))

    def _refill(self, now_ms: int) -> None:
        if self.last_ms is not None and now_ms > self.last_ms:
            refilled = self.level + (now_ms - self.last_ms) * self.per_ms
            self.level = min(Fraction(self.capacity), refilled)
        self.last_ms = now_ms if self.last_ms is None else max(self.last_ms, now_ms)

    def _ms_until(self, tokens: int) -> int:
        """Whole ms until the level reaches `tokens`."""
        return max(0, math.ceil((tokens - self.level) / self.per_ms))


@dataclass(slots=True)
class TokenBuckets:
    """Exact buckets for any number of keys, all under one limit."""

    limit: RateLimit
    buckets: dict[KeyId, Bucket] = field(default_factory=dict)

    def take(self, key: KeyId, now_ms: int, hits: int) -> Answer:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket.of(self.limit)
        return bucket.take(now_ms, hits)


def decide(limit: RateLimit, log: Iterable[tuple[int, int]]) -> list[Answer]:
    """Every answer of one key's bucket to a log of (time ms, hits), in time order."""
    bucket = Bucket.of(limit)
    return [bucket.take(now_ms, hits) for now_ms, hits in log]
