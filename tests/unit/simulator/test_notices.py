"""The store's notices in the simulator (simulator/notices.py): which pushes announce what, and
what a node does on hearing them, on a fake clock."""

from __future__ import annotations

from ratelimit_sidecar.core import Code, FleetLimiter, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.core.types import Push
from simulator.notices import Block, Near, announced, announces_near, deliver
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary
RULE = rule(rpu=100, spans=2, cooldown_ms=2_000)


def answered(*rows: tuple[int, int, int]) -> tuple[SyncBatch, SyncResult]:
    """Pushes of (hits, total after, block ms) of one key."""
    key, limit = hit(RULE).key, RULE.limits[0]
    batch = SyncBatch(T0, [Push(key, T0 // 1000, hits, limit) for hits, _, _ in rows])
    return batch, SyncResult(tuple(PushResult(total, block) for _, total, block in rows))


def test_only_the_push_that_crosses_half_the_limit_announces_it() -> None:
    limit = RULE.limits[0]
    assert [announces_near(limit, total, 10) for total in (49, 50, 59, 60)] == [
        False,
        True,
        True,
        False,
    ]
    batch, answer = answered((10, 45, 0), (10, 55, 0), (10, 65, 0))
    assert announced(batch, answer) == [Near(hit(RULE).key, T0 // 1000, 55)]


def test_a_key_alone_has_every_push_from_half_the_limit_to_max_announced() -> None:
    limit = RULE.limits[0]
    totals = (45, 55, 65, 100, 101)
    assert [announces_near(limit, total, 10, announce=True) for total in totals] == [
        False,
        True,
        True,
        True,
        False,
    ]
    assert not announces_near(limit, 65, 0, announce=True)  # a read adds nothing to tell


def test_a_block_is_announced_by_the_push_that_starts_it_only() -> None:
    batch, answer = answered((50, 101, 2_000), (1, 102, 1_990))
    assert announced(batch, answer) == [Block(hit(RULE).key, 2_000, 100)]


def test_a_node_hearing_a_block_refuses_for_what_is_left_of_it() -> None:
    limiter = FleetLimiter()
    limiter.hit(T0 + 1, [hit(RULE)])
    deliver(limiter, Block(hit(RULE).key, 2_000, 100), T0 + 10, late_ms=5)
    assert limiter.hit(T0 + 11, [hit(RULE)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 10 + 1_995, [hit(RULE)]).code is Code.OK
