"""A limit raised (a runtime override, a reload) lifts a fleet-wide block set for the lower
limit: the node's own block and the store's flag, on a fake clock."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a minute's start
SPAN = 30_000  # a minute in two spans


def _sync(store: MemoryStorage, nodes: list[FleetLimiter], now: int) -> None:
    for node in nodes:
        batch = node.end_span(now)
        node.apply_sync(now, batch, store.execute(batch))


def _codes(nodes: list[FleetLimiter], r: Rule, now: int, each: int) -> list[Code]:
    return [node.hit(now, [hit(r)]).code for node in nodes for _ in range(each)]


def test_a_raised_limit_lifts_the_fleet_wide_block_of_the_lower_one() -> None:
    store, nodes = MemoryStorage(), [FleetLimiter(), FleetLimiter()]
    three = rule(3, unit=Unit.MINUTE, cooldown_ms=50_000)
    assert three.limit is not None
    _codes(nodes, three, T0 + 1_000, each=3)
    _sync(store, nodes, T0 + SPAN)  # 6 > 3: the flag is set, 50 s
    assert _codes(nodes, three, T0 + SPAN + 1, each=1) == [Code.OVER_LIMIT] * 2

    hundred = Rule(three.domain, three.path, replace(three.limit, requests_per_unit=100))
    for span in range(1, 4):  # through the flag's 50 s, and after
        now = T0 + span * SPAN
        assert _codes(nodes, hundred, now + 1_000, each=3) == [Code.OK] * 6, span
        _sync(store, nodes, now + SPAN)


def test_a_lowered_or_unchanged_limit_keeps_the_block() -> None:
    store, nodes = MemoryStorage(), [FleetLimiter(), FleetLimiter()]
    three = rule(3, unit=Unit.MINUTE, cooldown_ms=50_000)
    assert three.limit is not None
    _codes(nodes, three, T0 + 1_000, each=3)
    _sync(store, nodes, T0 + SPAN)
    assert _codes(nodes, three, T0 + SPAN + 1, each=1) == [Code.OVER_LIMIT] * 2

    two = Rule(three.domain, three.path, replace(three.limit, requests_per_unit=2))
    _sync(store, nodes, T0 + 2 * SPAN)  # the next window: its count is 0, the flag still runs
    assert _codes(nodes, two, T0 + 2 * SPAN + 1, each=1) == [Code.OVER_LIMIT] * 2
    _sync(store, nodes, T0 + 2 * SPAN + 2)  # the store's answer: the flag set for 3 holds at 2
    assert _codes(nodes, two, T0 + 2 * SPAN + 3, each=1) == [Code.OVER_LIMIT] * 2
    _sync(store, nodes, T0 + 3 * SPAN)  # the flag ended at T0 + 80 s
    assert _codes(nodes, two, T0 + 3 * SPAN + 1, each=1) == [Code.OK] * 2


def test_a_block_announced_for_a_lower_limit_is_ignored() -> None:
    """A node that had not seen the raise yet started it: not for this node's limit."""
    limiter, r = FleetLimiter(), rule(100, unit=Unit.MINUTE, cooldown_ms=50_000)
    limiter.hit(T0, [hit(r)])

    assert not limiter.apply_block(hit(r).key, 50_000, T0 + 1, set_for=3)
    assert limiter.hit(T0 + 2, [hit(r)]).code is Code.OK
    assert limiter.apply_block(hit(r).key, 50_000, T0 + 3, set_for=100)  # its own limit
    assert limiter.apply_block(hit(r).key, 60_000, T0 + 4, set_for=0)  # not known: holds
    assert limiter.hit(T0 + 5, [hit(r)]).code is Code.OVER_LIMIT
