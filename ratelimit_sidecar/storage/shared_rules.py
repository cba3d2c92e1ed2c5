"""The store's side of the core/storage contract per algorithm: the arithmetic every store
follows for a push (pure; the store's clock is a parameter).

The simulator's `MemoryStorage` computes with these, the sync scripts do the same in the same
order, and the contract tests check Redis against them: a rule changes here first. Every push
INCRBYs its window's counter (the nodes estimate reads it); a sliding window's also its span's
counter, answered with the window's span totals; a token bucket keeps its TAT (epoch ms),
answered with its debt. A block flag records the requests per unit it was set for; a push of a
raised limit finds it `lifted` and deletes it first.
"""

from __future__ import annotations

import math

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.limiter import lifts_block
from ratelimit_sidecar.core.types import Push

TAT_DECIMALS = 3  # a TAT is stored with microsecond resolution: no drift from rounding per push


def window_ttl_ms(limit: RateLimit) -> int:
    """Two windows: the total is read once the window is over."""
    return 2 * limit.window_ms


def pushed_span(push: Push) -> int:
    """-1 stands for its window's last span."""
    if push.span >= 0:
        return push.span
    return push.window * push.limit.spans + push.limit.spans - 1


def answered_spans(span: int, limit: RateLimit) -> range:
    """The window ending with `span`."""
    return range(span - limit.spans + 1, span + 1)


def span_ttl_ms(limit: RateLimit) -> int:
    """The last push reading a span comes a window later, give or take a sync's delay."""
    return limit.window_ms + 2 * -(-limit.window_ms // limit.spans)


def next_tat(tat: float, now_ms: int, count: int, limit: RateLimit) -> float:
    """After `count` hits (0: read only; negative: given back), never before now, rounded as
    stored."""
    moved = max(tat, now_ms) + count * limit.window_ms / limit.requests_per_unit
    return stored_tat(max(moved, now_ms))


def stored_tat(tat: float) -> float:
    return float(f"{tat:.{TAT_DECIMALS}f}")


def bucket_debt_ms(tat: float, now_ms: int) -> int:
    return math.ceil(max(0.0, tat - now_ms))


def bucket_ttl_ms(tat: float, now_ms: int) -> int:
    """Forgotten when full again (at least Redis' 1 ms)."""
    return max(1, bucket_debt_ms(tat, now_ms))


def bucket_full_debt_ms(limit: RateLimit) -> float:
    return limit.capacity * limit.window_ms / limit.requests_per_unit


def block_above(limit: RateLimit) -> float:
    if limit.algorithm is AlgorithmName.TOKEN_BUCKET:
        return bucket_full_debt_ms(limit)
    return limit.requests_per_unit


def blocks(limit: RateLimit, total: int) -> bool:
    """SET NX PX cooldown; without a cooldown the flag is never set nor read."""
    return limit.cooldown > 0 and total > block_above(limit)


def lifted(set_for: int, limit: RateLimit) -> bool:
    """The limit was raised since (`lifts_block`): deleted before the push, so a block at the new
    limit may start."""
    return lifts_block(set_for, limit)
