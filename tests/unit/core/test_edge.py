"""Keys at the edge (core/edge.py): decided from memory, pushed fast while the fleet could reach
MAX before the next span sync. MAX 1000 per second in 2 spans of 500 ms, 4 live nodes; the clock
is a parameter."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from ratelimit_sidecar.config.model import Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.edge import (
    MIN_PERIOD_MS,
    SLACK,
    at_edge,
    estimate,
    new_key_push_at,
    tiny,
)
from ratelimit_sidecar.core.fixed_window import _estimate as fixed_estimate
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.quota_assign import QuotaPolicy
from ratelimit_sidecar.core.types import SyncBatch
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary


def edge_rule(rpu: int = 1000, **options: object) -> Rule:
    plain = rule(rpu=rpu, spans=2, **options)  # type: ignore[arg-type]
    assert plain.limit is not None
    limit = replace(plain.limit, edge=True)
    return replace(plain, limit=limit, limits=(limit,))


EDGE = edge_rule()


def fleet(live_nodes: int = 4) -> FleetLimiter:
    limiter = FleetLimiter(key_digest="|".join)
    limiter.apply_sync(T0, limiter.end_span(T0), SyncResult(live_nodes=live_nodes))
    return limiter


def state_of(limiter: FleetLimiter, r: Rule = EDGE, value: str = "v") -> KeyState:
    state = limiter.keys.get(hit(r, value).key)
    assert state is not None
    return state


def hits(limiter: FleetLimiter, now: int, n: int, r: Rule = EDGE, value: str = "v") -> list[Code]:
    return [limiter.hit(now, [hit(r, value)]).code for _ in range(n)]


def answer(limiter: FleetLimiter, now: int, total: int) -> SyncBatch:
    """A sync at `now`, every push answered with the window's `total`."""
    batch = limiter.end_span(now)
    pushes = tuple(PushResult(total, 0) for _ in batch.pushes)
    limiter.apply_sync(now, batch, SyncResult(pushes, (total,) * len(batch.total_reads)))
    return batch


def test_a_key_far_from_its_limit_is_synced_at_span_ends_only() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 120)  # 120 x (1 + a horizon of 600 ms / 600 ms) < 1000
    assert not state_of(limiter).window_counts().edge
    hits(limiter, T0 + 510, 30)
    assert limiter.early.due_ms is None  # nothing asked before the next span end


def test_a_total_the_fleet_could_take_to_max_before_the_next_sync_enters_the_edge() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)  # 520 x 2 >= 1000
    counts = state_of(limiter).window_counts()
    assert counts.edge and counts.ceiling == 1000 * (1 + SLACK)
    hits(limiter, T0 + 510, 1)
    assert limiter.early.due_ms == T0 + 510  # within a period of the last push: at once
    batch = limiter.end_span(T0 + 510)
    assert [(push.hits, push.edge) for push in batch.pushes] == [(1, True)]


def test_at_the_edge_hits_are_pushed_every_period_not_every_request() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)
    hits(limiter, T0 + 501, 1)  # the sync at T0 + 500 pushed: the next push a period later
    due = limiter.early.due_ms
    assert due is not None and T0 + 500 + MIN_PERIOD_MS <= due <= T0 + 1000
    assert not limiter.end_span(T0 + 501)  # not yet: nothing to send
    limiter.apply_sync(T0 + 501, limiter.batch_in_flight(), SyncResult())
    hits(limiter, T0 + 502, 1)
    assert limiter.early.due_ms == due


def test_a_burst_at_the_edge_is_pushed_at_once() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)
    hits(limiter, T0 + 501, 2)
    assert limiter.early.due_ms != T0 + 501
    hits(limiter, T0 + 502, 1)  # 3 x 4 nodes >= 1 % of 1000
    assert limiter.early.due_ms == T0 + 502


def test_an_edge_notice_switches_the_node_and_asks_for_its_unpushed_hits() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 5)
    key = hit(EDGE).key
    limiter.apply_near(key, "|".join(key), T0 // 1000, 900, T0 + 300, edge=True)
    counts = state_of(limiter).window_counts()
    assert counts.edge and counts.seen == 900
    assert limiter.early.due_ms == T0 + 300
    batch = limiter.end_span(T0 + 300)
    assert [(push.hits, push.edge) for push in batch.pushes] == [(5, True)]


def test_at_the_edge_the_estimate_counts_own_hits_once() -> None:
    """Away from the edge each unpushed hit stands for `nodes`; at the edge the others' hits
    are their share of the fleet's pace since the total, which pushes keep young."""
    limiter = fleet()
    hits(limiter, T0 + 1, 5)
    key = hit(EDGE).key
    limiter.apply_near(key, "|".join(key), T0 // 1000, 980, T0 + 300, edge=True)
    answer(limiter, T0 + 300, 985)
    codes = hits(limiter, T0 + 301, 30)
    assert codes.count(Code.OK) == 15  # 985 + 15 = 1000: the known count refuses past MAX
    assert codes[15:] == [Code.OVER_LIMIT] * 15


def test_the_edge_ends_with_its_window() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)
    hits(limiter, T0 + 1001, 1)
    counts = state_of(limiter).window_counts()
    assert not counts.edge and counts.ceiling == 1000


def test_with_the_store_down_nothing_is_pushed_early() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)
    hits(limiter, T0 + 510, 1)
    batch = limiter.end_span(T0 + 510)
    assert batch.pushes
    limiter.apply_sync(T0 + 510, batch, None)  # the store failed: local thresholds decide
    assert not limiter.store_up
    assert hits(limiter, T0 + 610, 5) == [Code.OK] * 5
    assert limiter.early.due_ms is None


def test_a_tiny_limit_is_at_the_edge_from_its_first_hit() -> None:
    """3 a second on 3 gateways: each gateway's first hit could take the fleet past it."""
    limiter, three = fleet(live_nodes=3), edge_rule(rpu=3)
    assert tiny(three.limit, 3) and not tiny(EDGE.limit, 3)  # type: ignore[arg-type]
    assert hits(limiter, T0 + 1, 1, three) == [Code.OK]
    assert state_of(limiter, three).window_counts().edge
    assert limiter.early.due_ms == T0 + 1


def test_a_new_key_pushes_after_a_few_hits_and_a_key_seen_once_pushes_nothing() -> None:
    limiter = fleet()
    at = new_key_push_at(EDGE.limit)  # type: ignore[arg-type]
    hits(limiter, T0 + 1, 1, value="once")
    hits(limiter, T0 + 1, int(at), value="new")
    assert limiter.early.due_ms is None
    hits(limiter, T0 + 2, 1, value="new")  # past 1 % of MAX: its window's total, now
    assert limiter.early.due_ms == T0 + 2
    batch = limiter.end_span(T0 + 2)
    assert [push.key[2] for push in batch.pushes] == ["new"]


def test_a_node_whose_block_ended_reads_the_total_again_before_it_admits_much() -> None:
    """The others (or nodes that joined meanwhile) may have taken the window to MAX."""
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 1001)  # over: blocked until the flag's end
    state = state_of(limiter)
    state.blocked_until = T0 + 1200  # a cooldown into the next window
    assert hits(limiter, T0 + 1100, 1) == [Code.OVER_LIMIT]
    answer(limiter, T0 + 1100, 0)  # the span end's sync: a blocked key pushes nothing
    hits(limiter, T0 + 1200, int(new_key_push_at(EDGE.limit)) + 1)  # type: ignore[arg-type]
    assert limiter.early.due_ms == T0 + 1200


def test_a_push_between_span_ends_plans_only_the_keys_that_asked() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    hits(limiter, T0 + 1, 30, value="other")
    answer(limiter, T0 + 500, 520)  # both at the edge now
    hits(limiter, T0 + 600, 1, value="other")
    hits(limiter, T0 + 600, 1)
    quiet = rule(rpu=1000, spans=2)
    hits(limiter, T0 + 600, 40, quiet)  # an eventual key with hits: waits for the span end
    batch = limiter.end_span(T0 + 600)
    assert sorted(push.key[2] for push in batch.pushes) == ["other", "v"]
    limiter.apply_sync(T0 + 600, batch, SyncResult((PushResult(530, 0),) * 2))
    assert limiter.next_span_end(T0 + 600) == T0 + 1000


def test_a_span_end_passed_between_two_early_pushes_is_not_skipped() -> None:
    """A push planned just before a span end may be answered after it: the next sync still
    looks at every key."""
    limiter = fleet()
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 520)
    quiet = rule(rpu=1000, spans=2)
    hits(limiter, T0 + 990, 40, quiet)
    hits(limiter, T0 + 990, 1)
    answer(limiter, T0 + 990, 530)  # only the edge key
    assert limiter.next_span_end(T0 + 1005) == T0 + 1000  # due already
    batch = limiter.end_span(T0 + 1005)
    assert [push.key for push in batch.pushes] == [hit(quiet).key]


def test_at_edge_weighs_the_estimate_by_the_time_left_in_the_horizon() -> None:
    limiter = fleet()
    hits(limiter, T0 + 1, 1)
    state = state_of(limiter)
    counts = state.window_counts()
    counts.seen = 400
    assert not at_edge(state, counts, T0 + 900, 4)  # 404 x (1 + 600 / 900) < 1000
    counts.seen = 600
    assert at_edge(state, counts, T0 + 900, 4)


def test_a_key_fed_by_rlqs_reports_within_a_minute_stays_eventual() -> None:
    """A gateway's usage between its reports reaches no store: pushing fast holds nothing."""
    limiter = fleet()
    over = QuotaPolicy().edge_over_ms
    limiter.count_admitted(T0 + 1, hit(EDGE), None, edge_over_ms=over)
    limiter.count_admitted(T0 + 2, hit(EDGE, hits=30), None, edge_over_ms=over)
    state = state_of(limiter)
    assert not state.edge
    answer(limiter, T0 + 500, 520)
    assert not state.window_counts().edge
    assert limiter.early.due_ms is None


@pytest.mark.parametrize(
    ("unit", "edge"), [(Unit.MINUTE, False), (Unit.HOUR, True), (Unit.DAY, True)]
)
def test_a_key_fed_by_rlqs_reports_keeps_the_edge_in_windows_over_a_minute(
    unit: Unit, edge: bool
) -> None:
    """A report's lag is small against an hour: near MAX its counts are pushed at once."""
    r = edge_rule(unit=unit)
    limiter = fleet()
    over = QuotaPolicy().edge_over_ms
    limiter.count_admitted(T0 + 1, hit(r), None, edge_over_ms=over)
    state = state_of(limiter, r)
    state.window_counts().seen = 990
    limiter.count_admitted(T0 + 2, hit(r, hits=5), None, edge_over_ms=over)
    assert state.edge is edge and state.window_counts().edge is edge
    assert limiter.early.due_ms == (T0 + 2 if edge else None)


def test_a_report_past_a_new_keys_first_hits_asks_for_its_windows_total() -> None:
    """A node that joined a day's window at MAX learns the total once a report takes the key
    past 1 % of MAX, not at its span end 12 h later, and its shares follow it."""
    r = edge_rule(unit=Unit.DAY)
    limiter = fleet()
    over = QuotaPolicy().edge_over_ms
    limiter.count_admitted(T0 + 1, hit(r, hits=5), None, edge_over_ms=over)
    assert limiter.early.due_ms is None
    limiter.count_admitted(T0 + 2, hit(r, hits=10), None, edge_over_ms=over)
    assert limiter.early.due_ms == T0 + 2


def test_a_key_first_heard_at_the_edge_starts_at_the_edge() -> None:
    """3 a second on 3 gateways: the first gateway's push is heard before this one's first
    request, which is then counted once, not as every gateway's."""
    limiter, three = fleet(live_nodes=3), edge_rule(rpu=3)
    key = hit(three).key
    limiter.apply_near(None, "|".join(key), T0 // 1000, 1, T0 + 5, edge=True)
    assert hits(limiter, T0 + 6, 1, three) == [Code.OK]
    counts = state_of(limiter, three).window_counts()
    assert counts.edge and counts.seen == 1


def test_a_hit_under_the_last_threshold_is_not_checked_again() -> None:
    """The threshold only rises as the window goes on: the one computed last stands until the
    estimate passes it, then it is computed anew (a hit away from the edge costs a compare)."""
    limiter = fleet(live_nodes=1)
    hits(limiter, T0 + 1, 30)
    answer(limiter, T0 + 500, 100)
    hits(limiter, T0 + 600, 1)
    counts = state_of(limiter).window_counts()
    assert counts.edge_from == 500  # 1000 / (1 + 600 / 600)
    hits(limiter, T0 + 900, 1)  # now 600, but 102 is under 500: not computed
    assert counts.edge_from == 500
    counts.seen = 550
    hits(limiter, T0 + 900, 1)
    assert counts.edge_from == 600 and not counts.edge  # 1000 / (1 + 600 / 900)


def test_the_fixed_windows_own_estimate_is_the_edges() -> None:
    """`fixed_window._estimate` is `edge.estimate` in the compiled module of the hot path."""
    rng = random.Random(7)
    limiter = fleet()
    hits(limiter, T0 + 1, 1)
    state = state_of(limiter)
    counts = state.window_counts()
    for _ in range(1000):
        counts.seen, counts.resumed = rng.randrange(5000), rng.randrange(50)
        state.inflight, state.pending = rng.randrange(100), rng.randrange(100)
        state.nodes.value = rng.uniform(1, 12)
        assert fixed_estimate(state, counts) == estimate(state, counts)
