"""Quiet keys cost the store nothing; a new key of one gateway gets its whole limit
(core/quiet_keys.py, core/fleet.py). MAX 100 per second in 2 spans of 500 ms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, Rule
from ratelimit_sidecar.core import Code, FleetLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.schedule import BEAT_MS, SyncSchedule
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary
RULE = rule(rpu=100, spans=2)


def fleet(live_nodes: int = 4, **options: object) -> FleetLimiter:
    """A fleet limiter whose first sync (an empty batch) has told it the live node count."""
    limiter = FleetLimiter(key_digest="|".join, **options)  # type: ignore[arg-type]
    limiter.apply_sync(T0, limiter.end_span(T0), SyncResult(live_nodes=live_nodes))
    return limiter


def state_of(limiter: FleetLimiter, r: Rule = RULE, value: str = "v") -> KeyState:
    state = limiter.keys.get(hit(r, value).key)
    assert state is not None
    return state


def sync(limiter: FleetLimiter, now: int, *totals: int) -> int:
    """One span end answered with `totals` (one per push); returns the pushes it sent."""
    batch = limiter.end_span(now)
    answers = tuple(PushResult(total, 0) for total in totals)
    answers += (PushResult(0, 0),) * (len(batch.pushes) - len(answers))
    limiter.apply_sync(now, batch, SyncResult(answers, (0,) * len(batch.total_reads)))
    return len(batch.pushes) + len(batch.total_reads)


def test_a_quiet_key_sends_nothing_and_its_window_ends_with_its_hits_here() -> None:
    limiter = fleet()
    limiter.hit(T0 + 1, [hit(RULE)])  # 1 x 4 live nodes < 10 % of 100
    limiter.hit(T0 + 2, [hit(RULE)])  # 2 x 4 = 8: still quiet
    assert sync(limiter, T0 + 500) == 0
    assert sync(limiter, T0 + 1000) == 0  # the window ended: no push, no read
    assert sync(limiter, T0 + 1500) == 0
    assert limiter.quiet.hits == 2 and limiter.dropped_hits == 0


def test_a_key_over_the_quiet_bound_is_synced_every_span() -> None:
    limiter, four_spans = fleet(), rule(rpu=100, spans=4)
    for i in range(3):  # 3 x 4 = 12 >= 10
        limiter.hit(T0 + i, [hit(four_spans)])
    batch = limiter.end_span(T0 + 250)
    assert [push.hits for push in batch.pushes] == [3]
    limiter.apply_sync(T0 + 250, batch, SyncResult((PushResult(3, 0),)))
    assert sync(limiter, T0 + 500) == 1  # an empty span still syncs (total and flag)


def test_a_window_with_a_block_starts_the_next_one_synced() -> None:
    """A blocked node stops reading the total: the block says the window was over."""
    limiter = fleet()
    for i in range(3):  # 3 x 4 = 12 >= 10: synced
        limiter.hit(T0 + i, [hit(RULE)])
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(3, 400),)))  # the fleet's flag
    assert limiter.hit(T0 + 600, [hit(RULE)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 1001, [hit(RULE)]).code is Code.OK  # 1 x 4 < 10, but near
    assert [push.hits for push in limiter.end_span(T0 + 1500).pushes] == [1]


def test_a_shutdown_pushes_the_quiet_hits_too() -> None:
    limiter = fleet()
    limiter.hit(T0 + 1, [hit(RULE)])
    assert limiter.pending_hits() == 1
    batch = limiter.end_span(T0 + 200, flush=True)
    assert [push.hits for push in batch.pushes] == [1]


def test_without_a_known_node_count_nothing_is_held() -> None:
    limiter = FleetLimiter()
    limiter.hit(T0 + 1, [hit(RULE)])
    assert [push.hits for push in limiter.end_span(T0 + 500).pushes] == [1]


def test_quiet_share_zero_syncs_every_key() -> None:
    limiter = fleet(quiet_share=0.0)
    limiter.hit(T0 + 1, [hit(RULE)])
    assert sync(limiter, T0 + 500) == 1


def test_a_near_notice_syncs_a_tracked_quiet_key_and_gives_it_the_total() -> None:
    limiter = fleet()
    limiter.hit(T0 + 1, [hit(RULE)])
    limiter.apply_near(hit(RULE).key, "|".join(hit(RULE).key), T0 // 1000, 60, T0 + 2)
    assert state_of(limiter).window_counts().seen == 60
    assert sync(limiter, T0 + 500) == 1


def test_a_key_heard_near_starts_from_the_announced_total() -> None:
    limiter = fleet()
    key = hit(RULE).key
    limiter.heard.put("|".join(key), T0 // 1000, 92)
    codes = [limiter.hit(T0 + 10 + i, [hit(RULE)]).code for i in range(10)]
    assert codes == [Code.OK] * 8 + [Code.OVER_LIMIT] * 2  # 92 + 8 = 100


def test_a_new_key_of_one_gateway_gets_its_whole_limit() -> None:
    """The demo's case: 3 gateways, 10 per window; one client on gateway A alone."""
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    codes = [limiter.hit(T0 + 10 + i, [hit(ten)]).code for i in range(12)]
    assert codes == [Code.OK] * 10 + [Code.OVER_LIMIT] * 2
    assert limiter.early.due_ms == T0 + 10 + 3  # the 4th hit passed 10 / 3: push now


def test_a_new_key_assumes_an_even_split_when_asked() -> None:
    limiter, ten = fleet(live_nodes=3, new_keys_alone=False), rule(rpu=10, spans=2)
    codes = [limiter.hit(T0 + 10 + i, [hit(ten)]).code for i in range(5)]
    assert codes == [Code.OK] * 3 + [Code.OVER_LIMIT] * 2  # each hit stands for 3


def test_the_early_push_leaves_before_the_span_end_and_teaches_the_share() -> None:
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    for i in range(4):
        limiter.hit(T0 + 10 + i, [hit(ten)])
    assert limiter.next_span_end(T0 + 20) == T0 + 13
    batch = limiter.end_span(T0 + 20)
    assert [push.hits for push in batch.pushes] == [4]
    # The store has 12: the other gateways sent 8 meanwhile; the share is capped at 3 nodes.
    limiter.apply_sync(T0 + 21, batch, SyncResult((PushResult(12, 0),)))
    state = limiter.keys.get(hit(ten).key)
    assert state is not None and state.nodes.value == 3
    assert limiter.early.due_ms is None and limiter.next_span_end(T0 + 30) == T0 + 500


def test_a_near_notice_makes_a_new_key_push_what_it_holds_at_once() -> None:
    """A burst every gateway sees at once: held hits must reach the others before the span ends."""
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    limiter.hit(T0 + 10, [hit(ten)])
    limiter.apply_near(hit(ten).key, "|".join(hit(ten).key), T0 // 1000, 6, T0 + 20)
    assert limiter.early.due_ms == T0 + 20 and limiter.next_span_end(T0 + 20) == T0 + 20


def test_a_key_alone_keeps_the_store_current_once_little_is_left() -> None:
    """The demo's gateway A: its last hits reach the store at once, marked for all to hear."""
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    for i in range(4):
        limiter.hit(T0 + 10 + i, [hit(ten)])
    batch = limiter.end_span(T0 + 14)  # the early push of 4
    for i in range(3):  # admitted while it is in flight
        limiter.hit(T0 + 15 + i, [hit(ten)])
    limiter.apply_sync(T0 + 20, batch, SyncResult((PushResult(4, 0),)))
    assert limiter.early.due_ms == T0 + 20  # 3 held, past (10 - 4) / 3: pushed at once
    batch = limiter.end_span(T0 + 20)
    assert [(push.hits, push.announce) for push in batch.pushes] == [(3, True)]
    limiter.apply_sync(T0 + 21, batch, SyncResult((PushResult(7, 0),)))
    assert limiter.early.due_ms is None
    limiter.hit(T0 + 30, [hit(ten)])  # (10 - 7) / 3 is under two: each hit goes
    assert limiter.early.due_ms == T0 + 30


def test_a_key_near_already_keeps_its_count_on_a_later_notice() -> None:
    """Later notices of a window are for nodes that do not track the key yet: here its own
    total since would count the others' hits twice."""
    limiter = fleet()
    limiter.hit(T0 + 1, [hit(RULE)])
    key, window = hit(RULE).key, T0 // 1000
    limiter.apply_near(key, "|".join(key), window, 60, T0 + 2)
    limiter.apply_near(key, "|".join(key), window, 80, T0 + 3)
    assert state_of(limiter).window_counts().seen == 60
    limiter.apply_near(None, "|".join(hit(RULE, "w").key), window, 70, T0 + 4)
    limiter.apply_near(None, "|".join(hit(RULE, "w").key), window, 90, T0 + 5)
    heard = limiter.heard.take(hit(RULE, "w").key, window)
    assert heard is not None and heard.total == 90


def test_after_its_first_window_a_key_waits_for_its_span_end_on_a_notice() -> None:
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    limiter.hit(T0 + 10, [hit(ten)])
    sync(limiter, T0 + 500)
    sync(limiter, T0 + 1000)
    limiter.hit(T0 + 1010, [hit(ten)])  # its second window: the even split is learnt or kept
    limiter.apply_near(hit(ten).key, "|".join(hit(ten).key), T0 // 1000 + 1, 6, T0 + 1020)
    assert limiter.early.due_ms is None and limiter.next_span_end(T0 + 1020) == T0 + 1500


def test_the_heartbeat_goes_with_the_first_sync_then_once_a_span() -> None:
    schedule = SyncSchedule(T0)
    starting = [schedule.heartbeat_due(T0 + t) for t in (0, 500, 1_000, 9_000)]
    assert starting == [True, False, True, True]  # once a second while the node starts
    idle = [schedule.heartbeat_due(T0 + 9_000 + t) for t in (BEAT_MS - 1, BEAT_MS)]
    assert idle == [False, True]  # then, no rule tracked: every BEAT_MS
    last = T0 + 9_000 + BEAT_MS
    spans = [schedule.heartbeat_due(last + t, 2_000) for t in (1_000, 2_000, 4_000)]
    assert spans == [False, True, True]  # one per 2 s span
    fast = [schedule.heartbeat_due(last + 10_000 + t, 100) for t in (0, 500, 1_000)]
    assert fast == [True, False, True]  # at most one a second


def test_a_notice_of_its_own_push_in_flight_does_not_count_that_push_twice() -> None:
    """The demo's gateway A again: the store announces its push of 7 on the subscriber's
    connection, which may be read before the push's own answer."""
    limiter, ten = fleet(live_nodes=3), rule(rpu=10, spans=2)
    for i in range(4):
        limiter.hit(T0 + 10 + i, [hit(ten)])
    sync(limiter, T0 + 14, 4)  # the early push of 4, answered
    for i in range(3):
        limiter.hit(T0 + 15 + i, [hit(ten)])
    batch = limiter.end_span(T0 + 18)  # 3 in flight
    limiter.apply_near(hit(ten).key, "|".join(hit(ten).key), T0 // 1000, 7, T0 + 19)
    assert limiter.hit(T0 + 20, [hit(ten)]).code is Code.OK  # 8 of 10
    limiter.apply_sync(T0 + 21, batch, SyncResult((PushResult(7, 0),)))
    assert [limiter.hit(T0 + 22 + i, [hit(ten)]).code for i in range(3)] == [
        Code.OK,
        Code.OK,
        Code.OVER_LIMIT,
    ]


def test_a_notice_read_while_a_push_is_in_flight_counts_in_full_with_its_answer() -> None:
    """The other gateway's push landed after this one's: its total holds both, more than this
    push's answer says. Kept until that answer, it is neither lost nor counted twice."""
    limiter, ten = fleet(live_nodes=2), rule(rpu=10, spans=2)
    for i in range(4):
        limiter.hit(T0 + 10 + i, [hit(ten)])
    batch = limiter.end_span(T0 + 500)  # 4 in flight
    limiter.apply_near(hit(ten).key, "|".join(hit(ten).key), T0 // 1000, 8, T0 + 501)
    limiter.apply_sync(T0 + 502, batch, SyncResult((PushResult(4, 0),)))
    codes = [limiter.hit(T0 + 510 + i, [hit(ten)]).code for i in range(3)]
    assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT]  # 8 of 10 known: two left


def trailing(algorithm: AlgorithmName, edge: bool = True) -> Rule:
    limit = replace(RULE.limits[0], algorithm=algorithm, edge=edge)
    return replace(RULE, limit=limit, limits=(limit,))


TRAILING = [AlgorithmName.SLIDING_WINDOW, AlgorithmName.TOKEN_BUCKET]


@pytest.mark.parametrize("algorithm", TRAILING)
def test_an_eventual_trailing_key_is_never_quiet(algorithm: AlgorithmName) -> None:
    limiter = fleet()
    limiter.hit(T0 + 1, [hit(trailing(algorithm, edge=False))])
    assert sync(limiter, T0 + 500) == 1


def test_a_sliding_key_at_the_edge_holds_its_hits_while_they_count() -> None:
    """Held across the window's end (the next window's trailing count holds them), forgotten
    once out of it: the span leaving the window still counts in part."""
    limiter, sliding = fleet(), trailing(AlgorithmName.SLIDING_WINDOW)
    limiter.hit(T0 + 1, [hit(sliding)])  # 1 <= 1 % of MAX, 1 x 4 < 10 % of MAX
    assert sync(limiter, T0 + 500) == 0
    assert sync(limiter, T0 + 1000) == 0  # the window ended; its first span still leaves
    assert state_of(limiter, sliding).pending == 1
    assert sync(limiter, T0 + 1500) == 0
    assert state_of(limiter, sliding).pending == 0
    assert limiter.quiet.hits == 1 and limiter.dropped_hits == 0


def test_a_bucket_at_the_edge_forgets_its_held_hits_once_full_again() -> None:
    limiter, bucket = fleet(), trailing(AlgorithmName.TOKEN_BUCKET)
    limiter.hit(T0 + 1, [hit(bucket)])  # 4 nodes' worth: 40 ms of refill
    assert state_of(limiter, bucket).pending == 1
    assert sync(limiter, T0 + 500) == 0
    assert state_of(limiter, bucket).pending == 0 and limiter.quiet.hits == 1
    assert sync(limiter, T0 + 1000) == 0  # its window ended: no total read either
    assert sync(limiter, T0 + 1500) == 0


def test_a_held_sliding_key_pushes_every_held_hit_in_its_last_hits_span() -> None:
    """Seen twice, it is synced: the push carries the held hit too, a span late (it leaves the
    store's count later, never sooner)."""
    limiter, sliding = fleet(), trailing(AlgorithmName.SLIDING_WINDOW)
    span0 = T0 // 500
    limiter.hit(T0 + 1, [hit(sliding)])
    assert sync(limiter, T0 + 500) == 0
    limiter.hit(T0 + 600, [hit(sliding)])
    batch = limiter.end_span(T0 + 1000)
    assert [(push.hits, push.span) for push in batch.pushes] == [(2, span0 + 1)]
    limiter.apply_sync(T0 + 1000, batch, SyncResult((PushResult(0, 0, spans=(0, 5)),)))
    assert sync(limiter, T0 + 1500) == 1  # pushed once: synced every span from now on


@pytest.mark.parametrize("algorithm", TRAILING)
def test_an_evicted_quiet_trailing_key_leaves_no_orphan_push(algorithm: AlgorithmName) -> None:
    limiter = fleet(max_keys=1)
    limiter.hit(T0 + 1, [hit(trailing(algorithm))])
    limiter.hit(T0 + 2, [hit(RULE, "other")])  # evicts the first
    assert [push.key for push in limiter.end_span(T0 + 500).pushes] == []
    assert limiter.dropped_hits == 0
