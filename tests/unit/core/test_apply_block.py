"""A block announced by the store (pub/sub) applied to a node's key, on a fake clock."""

from __future__ import annotations

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary


def test_an_announced_block_refuses_at_once_for_its_length() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, cooldown_ms=2000)
    assert limiter.hit(T0, [hit(r)]).code is Code.OK
    assert limiter.apply_block(hit(r).key, 1500, T0 + 10)
    refused = limiter.hit(T0 + 20, [hit(r)]).verdicts[0]
    assert (refused.code, refused.reset_ms) == (Code.OVER_LIMIT, 1490)  # the true wait
    assert limiter.hit(T0 + 1509, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 1510, [hit(r)]).code is Code.OK
    assert limiter.blocked_keys(T0 + 1509) == 1  # counted by the usual gauge


def test_an_untracked_key_or_an_empty_block_is_left_alone() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100)
    assert not limiter.apply_block(hit(r).key, 1000, T0)  # not tracked: nothing made
    assert len(limiter.keys) == 0
    limiter.hit(T0, [hit(r)])
    assert not limiter.apply_block(hit(r).key, 0, T0)
    assert limiter.hit(T0 + 1, [hit(r)]).code is Code.OK


def test_a_block_never_shortens_a_longer_one() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100)
    limiter.hit(T0, [hit(r)])
    assert limiter.apply_block(hit(r).key, 1000, T0)
    assert not limiter.apply_block(hit(r).key, 500, T0 + 100)  # ends before the first
    assert limiter.apply_block(hit(r).key, 1000, T0 + 100)  # ends later: extends it
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.blocked_until == T0 + 1100


def test_the_next_sync_keeps_an_announced_block() -> None:
    """The span-end answer (the same flag, read) agrees with the announcement: still blocked,
    and the hits admitted before it are pushed as usual."""
    store, limiter, r = MemoryStorage(), FleetLimiter(), rule(rpu=100, cooldown_ms=2000)
    for i in range(5):
        limiter.hit(T0 + i, [hit(r)])
    limiter.apply_block(hit(r).key, 2000, T0 + 100)
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, store.execute(batch))
    assert [p.hits for p in batch.pushes] == [5]
    assert limiter.hit(T0 + 600, [hit(r)]).code is Code.OVER_LIMIT


def test_every_algorithm_refuses_under_an_announced_block() -> None:
    for algorithm in AlgorithmName:
        limiter = FleetLimiter()
        limit = RateLimit(100, Unit.SECOND, spans=2, algorithm=algorithm, burst=100)
        r = Rule("d", (("k", ""),), limit)
        assert limiter.hit(T0, [hit(r)]).code is Code.OK, algorithm
        assert limiter.apply_block(hit(r).key, 300, T0 + 1), algorithm
        verdict = limiter.hit(T0 + 2, [hit(r)]).verdicts[0]
        assert (verdict.code, verdict.reset_ms) == (Code.OVER_LIMIT, 299), algorithm


def test_a_shadow_rule_reports_the_block_without_refusing() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, shadow=True)
    limiter.hit(T0, [hit(r)])
    limiter.apply_block(hit(r).key, 300, T0)
    verdict = limiter.hit(T0 + 1, [hit(r)]).verdicts[0]
    assert verdict.code is Code.OK and verdict.shadow_refused
