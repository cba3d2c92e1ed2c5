"""`cooldown: window_end`: a fixed window's block ends where its window ends (the reference's
behaviour), on every path that starts a block; the default cooldown still runs into the next."""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, LocalLimiter, PushResult
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit

T0 = 1_700_000_040_000  # a minute boundary
LATE = T0 + 59_000  # one second before the window ends


def _rule(window_end: bool) -> Rule:
    limit = RateLimit(2, Unit.MINUTE, spans=4, cooldown_window_end=window_end)
    return Rule("d", (("k", ""),), limit)


def test_a_late_crossing_is_blocked_only_until_the_window_ends() -> None:
    limiter, r = LocalLimiter(), _rule(window_end=True)
    assert [limiter.hit(LATE, [hit(r)]).code for _ in range(2)] == [Code.OK, Code.OK]

    refused = limiter.hit(LATE + 1, [hit(r)])

    assert refused.code is Code.OVER_LIMIT
    assert refused.verdicts[0].reset_ms == 999  # until the window boundary, not one window
    assert limiter.hit(T0 + 60_000, [hit(r)]).code is Code.OK


def test_the_default_cooldown_still_blocks_into_the_next_window() -> None:
    limiter, r = LocalLimiter(), _rule(window_end=False)
    for _ in range(3):
        limiter.hit(LATE, [hit(r)])

    assert limiter.hit(T0 + 60_000, [hit(r)]).code is Code.OVER_LIMIT


def test_a_store_total_over_the_limit_blocks_until_the_pushed_window_ends() -> None:
    r = _rule(window_end=True)
    assert r.limit is not None
    state = KeyState(("d", "k", "v"), r, r.limit, T0 + 20_000, 1)
    push = Push(state.key, state.window, 1, r.limit)
    FixedWindow().start(state, 0)

    FixedWindow().store_answer(state, push, PushResult(total=5, block_ms=0), T0 + 30_000)

    assert state.blocked_until == T0 + 60_000


def test_a_window_end_limit_sets_no_shared_flag_that_could_outlive_its_window() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), _rule(window_end=True)
    for _ in range(3):
        limiter.hit(LATE, [hit(r)])
    batch = limiter.end_span(T0 + 60_000)

    result = store.execute(batch)

    assert [answer.block_ms for answer in result.pushes] == [0]
    limiter.apply_sync(T0 + 60_000, batch, result)
    assert limiter.hit(T0 + 60_001, [hit(r)]).code is Code.OK
