"""Sliding windows and token buckets at the edge (core/edge.py): a key with no span totals asks
for them early, a grown fleet is believed at the next answer, and a bucket's answer never
lowers what the node projected for the fleet. MAX 1000 per second in 2 spans of 500 ms, 4 live
nodes; the clock is a parameter."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, Rule
from ratelimit_sidecar.core import FleetLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.edge import LATE_PUSH_MS, new_key_push_at
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.nodes_estimate import NodesEstimate
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary


def trailing_rule(algorithm: AlgorithmName, *, edge: bool = True, key: str = "k") -> Rule:
    plain = rule(rpu=1000, spans=2, key=key)
    assert plain.limit is not None
    limit = replace(plain.limit, algorithm=algorithm, edge=edge)
    return replace(plain, limit=limit, limits=(limit,))


SLIDING = trailing_rule(AlgorithmName.SLIDING_WINDOW)
BUCKET = trailing_rule(AlgorithmName.TOKEN_BUCKET)


def fleet(live_nodes: int = 4) -> FleetLimiter:
    limiter = FleetLimiter(key_digest="|".join)
    limiter.apply_sync(T0, limiter.end_span(T0), SyncResult(live_nodes=live_nodes))
    return limiter


def send(limiter: FleetLimiter, r: Rule, now: int, n: int) -> None:
    for _ in range(n):
        limiter.hit(now, [hit(r)])


def state_of(limiter: FleetLimiter, r: Rule) -> KeyState:
    state = limiter.keys.get(hit(r).key)
    assert state is not None
    return state


def sync(limiter: FleetLimiter, now: int, result: PushResult, live_nodes: int = 4) -> None:
    batch = limiter.end_span(now)
    pushes = tuple(result for _ in batch.pushes)
    reads = (0,) * len(batch.total_reads)
    limiter.apply_sync(now, batch, SyncResult(pushes, reads, live_nodes=live_nodes))


def test_a_sliding_key_without_span_totals_asks_for_them_after_a_few_hits() -> None:
    limiter = fleet()
    ask_past = int(new_key_push_at(SLIDING.limits[0]))  # 1 % of 1000
    send(limiter, SLIDING, T0 + 100, ask_past)
    assert limiter.early.due_ms is None
    send(limiter, SLIDING, T0 + 120, 1)
    assert limiter.early.due_ms == T0 + 120
    batch = limiter.end_span(T0 + 130)
    push = batch.pushes[0]
    # Its hits stay in their own span: an early push ends no span.
    assert (push.hits, push.span) == (ask_past + 1, T0 // 500)


def test_a_sliding_key_with_its_spans_known_waits_for_the_span_end() -> None:
    limiter = fleet()
    send(limiter, SLIDING, T0 + 100, 20)
    sync(limiter, T0 + 120, PushResult(400, 0, spans=(0, 400)))
    send(limiter, SLIDING, T0 + 130, 20)
    assert limiter.early.due_ms is None


def test_an_eventual_sliding_key_or_a_store_down_asks_for_nothing_early() -> None:
    limiter = fleet()
    eventual = trailing_rule(AlgorithmName.SLIDING_WINDOW, edge=False)
    send(limiter, eventual, T0 + 100, 50)
    assert limiter.early.due_ms is None
    limiter.store_up = False
    send(limiter, SLIDING, T0 + 100, 50)
    assert limiter.early.due_ms is None


def test_a_grown_fleet_is_believed_at_the_next_answer_of_a_key_at_the_edge() -> None:
    limiter = fleet()
    send(limiter, SLIDING, T0 + 100, 20)
    eventual = trailing_rule(AlgorithmName.SLIDING_WINDOW, edge=False, key="e")
    send(limiter, eventual, T0 + 100, 20)
    sync(limiter, T0 + 500, PushResult(80, 0, spans=(0, 80)))
    assert state_of(limiter, SLIDING).nodes.value == 4
    sync(limiter, T0 + 1000, PushResult(200, 0, spans=(200, 0)), live_nodes=6)
    assert state_of(limiter, SLIDING).nodes.value == 6  # 4 x 6 / 4
    assert state_of(limiter, eventual).nodes.value == 4  # learns from its windows, as before


def test_grow_scales_on_growth_only_and_survives_the_next_window() -> None:
    estimate = NodesEstimate(4)
    estimate.live = 4
    estimate.grow(3)
    assert estimate.value == 4  # a smaller fleet is left to the windows
    estimate.grow(6)
    assert estimate.value == 4 * 6 / 3
    learnt = NodesEstimate(4)
    learnt.live = 4
    for window, total in enumerate((240, 240)):  # two windows of 60 own hits in 240
        learnt.admitted = 60
        learnt.roll(window, consecutive=True)
        learnt.learn(window, total, 4)
    learnt.grow(6)
    learnt.admitted = 40  # a window with the joiners for half of it: 40 own of 200
    learnt.roll(2, consecutive=True)
    learnt.learn(2, 200, 6)
    assert learnt.value >= 5.5  # not back to the 5 of that one window


def test_a_nearly_empty_bucket_keeps_its_projection_until_the_read_again() -> None:
    for edge, kept in ((False, False), (True, True)):  # the edge last: read again below
        limiter = fleet()
        r = trailing_rule(AlgorithmName.TOKEN_BUCKET, edge=edge)
        send(limiter, r, T0 + 450, 150)  # 150 own hits stand for 600 of the fleet's 1000
        projected = state_of(limiter, r).bucket().tat
        # The first to push sees only its own hits: the others' of the span land later.
        sync(limiter, T0 + 500, PushResult(150, 0))
        assert (state_of(limiter, r).bucket().tat == projected) is kept
        assert (limiter.early.due_ms == T0 + 500 + LATE_PUSH_MS) is edge
    sync(limiter, T0 + 500 + LATE_PUSH_MS, PushResult(580, 0))  # every node's push is in
    assert state_of(limiter, r).bucket().tat == (T0 + 500 + LATE_PUSH_MS + 580) * 1000


def test_a_bucket_far_from_empty_takes_the_stores_debt_at_the_edge() -> None:
    limiter = fleet()
    send(limiter, BUCKET, T0 + 450, 50)  # 200 of 1000 projected: a span's refill is 500
    sync(limiter, T0 + 500, PushResult(50, 0))
    assert state_of(limiter, BUCKET).bucket().tat == (T0 + 550) * 1000
    assert limiter.early.due_ms is None


def test_a_sliding_window_near_max_reads_its_spans_again_after_a_span_end() -> None:
    limiter = fleet()
    send(limiter, SLIDING, T0 + 100, 20)
    sync(limiter, T0 + 120, PushResult(0, 0, spans=(0, 20)))  # its spans known: no more early
    send(limiter, SLIDING, T0 + 400, 100)
    # The first to push: 120 of its own, and what the span adds again over the horizon.
    sync(limiter, T0 + 500, PushResult(0, 0, spans=(0, 600)))
    assert limiter.early.due_ms == T0 + 500 + LATE_PUSH_MS
    sync(limiter, T0 + 500 + LATE_PUSH_MS, PushResult(0, 0, spans=(600, 0)))
    assert limiter.early.due_ms is None  # once a span
    far = fleet()
    send(far, SLIDING, T0 + 100, 20)
    sync(far, T0 + 120, PushResult(0, 0, spans=(0, 20)))
    sync(far, T0 + 500, PushResult(0, 0, spans=(0, 100)))
    assert far.early.due_ms is None


def test_pushes_between_span_ends_count_as_the_edges_store_work() -> None:
    limiter = fleet()
    send(limiter, SLIDING, T0 + 100, int(new_key_push_at(SLIDING.limits[0])) + 1)
    early = limiter.end_span(T0 + 100)
    assert [push.edge for push in early.pushes] == [True]
    limiter.apply_sync(T0 + 100, early, SyncResult((PushResult(0, 0, spans=(0, 10)),)))
    send(limiter, SLIDING, T0 + 200, 1)
    at_span_end = limiter.end_span(T0 + 500)
    assert [push.edge for push in at_span_end.pushes] == [False]


def test_a_bucket_under_two_spans_refill_is_read_at_span_ends_only() -> None:
    limiter = fleet()
    small = trailing_rule(AlgorithmName.TOKEN_BUCKET)
    limit = replace(small.limits[0], burst=900)  # a span refills 500 of it
    small = replace(small, limit=limit, limits=(limit,))
    send(limiter, small, T0 + 450, 200)  # 800 of 900 projected
    sync(limiter, T0 + 500, PushResult(200, 0))
    assert limiter.early.due_ms is None
    assert state_of(limiter, small).bucket().tat == (T0 + 700) * 1000
