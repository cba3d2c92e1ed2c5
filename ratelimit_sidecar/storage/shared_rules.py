"""The store's side of the core/storage contract, per algorithm: the arithmetic every store
follows when it applies a push. Pure: no I/O, the store's clock is a parameter.

The simulator's `MemoryStorage` computes with these functions; the Lua scripts (sync.lua,
sync_sliding.lua, sync_bucket.lua) do the same arithmetic in the same order, and the storage
contract tests check the Redis answers against these functions: a rule changes here first.

* every push INCRBYs its window's counter (TTL `window_ttl_ms`): the fixed window's own
  counter, and for the other algorithms the finished-window total the nodes estimate reads.
* sliding window: the push INCRBYs the counter of its span (`pushed_span`, TTL
  `span_ttl_ms`) and is answered the fleet's totals of `answered_spans`.
* token bucket: the store keeps the theoretical arrival time (TAT, epoch ms) and answers how
  far ahead of now its debt reaches (`bucket_debt_ms`).
* a block flag is set only when `blocks` says so, and records the requests per unit it was set
  for; a push whose limit was raised past that finds it `lifted` and deletes it first.
"""

from __future__ import annotations

import math

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.limiter import lifts_block
from ratelimit_sidecar.core.types import Push

TAT_DECIMALS = 3  # a TAT is stored with microsecond resolution: no drift from rounding per push


def window_ttl_ms(limit: RateLimit) -> int:
    """A window counter lives two windows: its total is read once the window is over."""
    return 2 * limit.window_ms


def pushed_span(push: Push) -> int:
    """The epoch span number a push counts in; -1 stands for the last span of its window."""
    if push.span >= 0:
        return push.span
    return push.window * push.limit.spans + push.limit.spans - 1


def answered_spans(span: int, limit: RateLimit) -> range:
    """The spans a sliding window push is answered with: the window ending with `span`."""
    return range(span - limit.spans + 1, span + 1)


def span_ttl_ms(limit: RateLimit) -> int:
    """One window plus two (longest) spans: the last push that reads a span comes one window
    after it, give or take a sync's delay."""
    return limit.window_ms + 2 * -(-limit.window_ms // limit.spans)


def next_tat(tat: float, now_ms: int, count: int, limit: RateLimit) -> float:
    """A token bucket's TAT after a push of `count` hits at `now_ms` (0: read only; negative:
    tokens given back), never before now, rounded as the store keeps it."""
    moved = max(tat, now_ms) + count * limit.window_ms / limit.requests_per_unit
    return stored_tat(max(moved, now_ms))


def stored_tat(tat: float) -> float:
    """The TAT as the store keeps it: a decimal with `TAT_DECIMALS` places."""
    return float(f"{tat:.{TAT_DECIMALS}f}")


def bucket_debt_ms(tat: float, now_ms: int) -> int:
    """The answer to a token bucket push: how many ms ahead of now the debt reaches."""
    return math.ceil(max(0.0, tat - now_ms))


def bucket_ttl_ms(tat: float, now_ms: int) -> int:
    """The TAT is forgotten when the bucket is full again (at least 1 ms: Redis' minimum)."""
    return max(1, bucket_debt_ms(tat, now_ms))


def bucket_full_debt_ms(limit: RateLimit) -> float:
    """The debt of an empty bucket: capacity tokens of window/requests_per_unit ms each."""
    return limit.capacity * limit.window_ms / limit.requests_per_unit


def block_above(limit: RateLimit) -> float:
    """The answered total above which the key is over its limit."""
    if limit.algorithm is AlgorithmName.TOKEN_BUCKET:
        return bucket_full_debt_ms(limit)
    return limit.requests_per_unit


def blocks(limit: RateLimit, total: int) -> bool:
    """Whether a push answered `total` sets the shared block flag (SET NX PX cooldown). A
    limit without a cooldown neither sets nor reads the flag: it is answered 0."""
    return limit.cooldown > 0 and total > block_above(limit)


def lifted(set_for: int, limit: RateLimit) -> bool:
    """Whether a block flag set for `set_for` requests per unit is lifted for a push of
    `limit` (core/limiter.py `lifts_block`: the limit was raised since): the store deletes it
    before the push is applied, so that a block at the new limit may start."""
    return lifts_block(set_for, limit)
