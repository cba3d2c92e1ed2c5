"""The request path and span bookkeeping of the core, on a fake clock (plain integers)."""

from __future__ import annotations

from ratelimit_sidecar.config.model import Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, LocalLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.local import IDLE_MS, SWEEP_EVERY_MS
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute


def sync(limiter: FleetLimiter, store: MemoryStorage, now: int) -> None:
    batch = limiter.end_span(now)
    limiter.apply_sync(now, batch, store.execute(batch))


def test_admits_up_to_the_limit_then_blocks_for_the_cooldown() -> None:
    limiter, r = FleetLimiter(), rule(rpu=3, cooldown_ms=500)
    codes = [limiter.hit(T0 + i, [hit(r)]).code for i in range(4)]
    assert codes == [Code.OK, Code.OK, Code.OK, Code.OVER_LIMIT]
    blocked = limiter.hit(T0 + 499, [hit(r)])
    assert blocked.code is Code.OVER_LIMIT
    # The block ends at T0 + 503, but the window stays full until T0 + 1000: the retry waits.
    assert blocked.verdicts[0].reset_ms == 1000 - 499
    assert limiter.hit(T0 + 1003, [hit(r)]).code is Code.OK  # block over, new window


def test_remaining_and_reset_are_reported_after_the_requests_own_hits() -> None:
    limiter, r = FleetLimiter(), rule(rpu=10)
    verdict = limiter.hit(T0 + 250, [hit(r, hits=4)]).verdicts[0]
    assert (verdict.remaining, verdict.reset_ms, verdict.limit) == (6, 750, r.limit)


def test_a_request_is_admitted_only_if_every_descriptor_admits_it() -> None:
    limiter = FleetLimiter()
    small, big = rule(rpu=1, key="a"), rule(rpu=100, key="b")
    assert limiter.hit(T0, [hit(big), hit(small)]).code is Code.OK
    decision = limiter.hit(T0 + 1, [hit(big), hit(small)])
    assert decision.code is Code.OVER_LIMIT
    assert [v.code for v in decision.verdicts] == [Code.OK, Code.OVER_LIMIT]
    assert decision.verdicts[0].remaining == 99  # the rejected request consumed nothing
    state = limiter.keys.get(hit(big).key)
    assert state is not None and state.pending == 1


def test_hits_zero_checks_without_counting() -> None:
    limiter, r = FleetLimiter(), rule(rpu=2)
    for _ in range(5):
        assert limiter.hit(T0, [hit(r, hits=0)]).code is Code.OK
    assert limiter.hit(T0, [hit(r, hits=2)]).verdicts[0].remaining == 0


def test_unmatched_unlimited_and_deny_rules() -> None:
    limiter = FleetLimiter()
    unlimited = Rule("d", (("k", ""),), None, unlimited=True)
    deny = rule(rpu=0)
    d = limiter.hit(T0, [hit(None), hit(unlimited)])
    assert d.code is Code.OK
    assert d.verdicts[0].limit is None and not d.verdicts[0].unlimited
    assert d.verdicts[1].unlimited
    assert limiter.hit(T0, [hit(deny)]).code is Code.OVER_LIMIT
    assert len(limiter.keys) == 0  # nothing to track for a deny list


def test_shadow_mode_answers_ok_but_counts() -> None:
    limiter, r = FleetLimiter(), rule(rpu=1, shadow=True)
    verdicts = [limiter.hit(T0, [hit(r)]).verdicts[0] for _ in range(3)]
    assert all(v.code is Code.OK for v in verdicts)
    assert [v.shadow_refused for v in verdicts] == [False, True, True]
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.nodes.admitted == 3


def test_span_end_pushes_the_span_and_seen_gates_the_rest_of_the_window() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), rule(rpu=10, spans=2)
    for _ in range(6):
        limiter.hit(T0, [hit(r)])
    assert limiter.next_span_end(T0) == T0 + 500
    batch = limiter.end_span(T0 + 500)
    assert [(p.window, p.hits) for p in batch.pushes] == [(T0 // 1000, 6)]
    limiter.apply_sync(T0 + 500, batch, store.execute(batch))
    codes = [limiter.hit(T0 + 600, [hit(r)]).code for _ in range(5)]
    assert codes == [Code.OK] * 4 + [Code.OVER_LIMIT]


def test_window_rollover_starts_a_new_count_and_pushes_the_last_span_late() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), rule(rpu=10, spans=2)
    for _ in range(10):
        limiter.hit(T0 + 900, [hit(r)])
    assert limiter.hit(T0 + 1000, [hit(r)]).code is Code.OK  # new window, fresh quota
    batch = limiter.end_span(T0 + 1000)
    assert sorted((p.window, p.hits) for p in batch.pushes) == [
        (T0 // 1000, 10),
        (T0 // 1000 + 1, 1),
    ]
    limiter.apply_sync(T0 + 1000, batch, store.execute(batch))


def test_store_totals_from_other_nodes_block_this_node() -> None:
    limiter, r = FleetLimiter(), rule(rpu=10, spans=2, cooldown_ms=300)
    limiter.hit(T0, [hit(r)])
    batch = limiter.end_span(T0 + 500)
    result = SyncResult(pushes=(_answer(total=11),))
    stats = limiter.apply_sync(T0 + 500, batch, result)
    assert stats.blocked_keys == 1
    assert limiter.hit(T0 + 799, [hit(r)]).code is Code.OVER_LIMIT
    # the block is over but seen is still over the limit: step 2 blocks again for the cooldown
    assert limiter.hit(T0 + 800, [hit(r)]).verdicts[0].reset_ms == 300
    assert limiter.hit(T0 + 1099, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 1100, [hit(r)]).code is Code.OK  # new window, block over


def test_shared_block_flag_blocks_a_node_that_did_not_cross() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, spans=2)
    limiter.hit(T0, [hit(r)])
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((_answer(5, block_ms=2000),)))
    assert limiter.hit(T0 + 2499, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 2500, [hit(r)]).code is Code.OK


def test_nodes_estimate_comes_from_the_previous_windows_total() -> None:
    limiter, r = FleetLimiter(), rule(rpu=1000, spans=2)
    for _ in range(10):
        limiter.hit(T0, [hit(r)])
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((_answer(10),)))
    batch = limiter.end_span(T0 + 1000)  # window rolled: no total read yet (others may lag)
    assert batch.total_reads == []
    limiter.apply_sync(T0 + 1000, batch, SyncResult((_answer(0),)))
    batch = limiter.end_span(T0 + 1500)
    assert [(t.window) for t in batch.total_reads] == [T0 // 1000]
    limiter.apply_sync(T0 + 1500, batch, SyncResult((_answer(0),), totals=(40,)))
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.nodes.value == 4.0
    # With 4 nodes each hit stands for 4. The store's total says this window is idle so far
    # (far under its pace bound), so the estimate may pass MAX by MAX / N: 1500 / 4 hits.
    assert state.window_counts().ceiling == 1500
    codes = [limiter.hit(T0 + 1600, [hit(r)]).code for _ in range(376)]
    assert codes.count(Code.OK) == 375


def test_store_failure_keeps_deltas_and_applies_the_fallback() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), rule(rpu=10, spans=2)
    for _ in range(6):  # 6 > MAX/N = 5: the fallback blocks
        limiter.hit(T0, [hit(r)])
    batch = limiter.end_span(T0 + 500)
    stats = limiter.apply_sync(T0 + 500, batch, None)
    assert stats.failed and stats.blocked_keys == 1 and stats.dropped_hits == 0
    assert limiter.hit(T0 + 600, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.pending_hits() == 6
    batch = limiter.end_span(T0 + 1000)  # the store is back: the unsent span goes out
    # ... as the key's one push of this span (its answer brings the block flag back too).
    assert [(p.window, p.hits) for p in batch.pushes] == [(T0 // 1000, 6)]
    limiter.apply_sync(T0 + 1000, batch, store.execute(batch))
    assert limiter.pending_hits() == 0


def test_one_push_per_key_and_span_whatever_the_traffic() -> None:
    """A window's last span is pushed after the window ends; a key with hits then must not add
    a second (empty) push for the new window, or the store's work would follow the traffic."""
    store, r = MemoryStorage(), rule(rpu=1000, spans=2)
    for busy in (False, True):
        limiter = FleetLimiter()
        for value in "abcd":
            limiter.hit(T0 + 100, [hit(r, value)])
        sync(limiter, store, T0 + 500)
        if busy:  # hits in the window's last span for two keys
            limiter.hit(T0 + 700, [hit(r, "a")])
            limiter.hit(T0 + 700, [hit(r, "b")])
        batch = limiter.end_span(T0 + 1000)
        assert len(batch.pushes) == 4
        limiter.apply_sync(T0 + 1000, batch, store.execute(batch))


def test_unsent_hits_older_than_a_window_are_dropped_and_counted() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, spans=2)
    limiter.hit(T0, [hit(r, hits=3)])
    for now in (T0 + 500, T0 + 1000, T0 + 1500, T0 + 2000):
        limiter.apply_sync(now, limiter.end_span(now), None)
    assert limiter.dropped_hits == 3
    assert limiter.pending_hits() == 0


def test_idle_keys_are_forgotten_after_two_windows() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), rule(rpu=100, spans=2)
    limiter.hit(T0, [hit(r)])
    for now in range(T0 + 500, T0 + 2501, 500):
        sync(limiter, store, now)
    assert len(limiter.keys) == 0


def test_key_table_is_bounded_and_eviction_loses_no_counts() -> None:
    limiter, store, r = FleetLimiter(max_keys=100), MemoryStorage(), rule(rpu=5)
    for i in range(10_000):
        limiter.hit(T0, [hit(r, value=str(i))])
    assert len(limiter.keys) == 100
    assert limiter.pending_hits() == 10_000
    sync(limiter, store, T0 + 500)
    assert limiter.pending_hits() == 0


def test_blocked_keys_are_not_evicted_for_room() -> None:
    limiter, r = FleetLimiter(max_keys=2), rule(rpu=1)
    for value in ("a", "b"):
        limiter.hit(T0, [hit(r, value)])
        limiter.hit(T0, [hit(r, value)])  # over: blocked
    assert limiter.hit(T0, [hit(r, "c")]).code is Code.OK  # decided untracked
    assert limiter.untracked == 1
    assert limiter.hit(T0, [hit(r, "a")]).code is Code.OVER_LIMIT


def _answer(total: int, block_ms: int = 0) -> PushResult:
    return PushResult(total, block_ms)


def test_a_timed_out_push_is_not_resent_so_it_cannot_count_twice() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, spans=2)
    limiter.hit(T0, [hit(r, hits=4)])
    batch = limiter.end_span(T0 + 500)
    stats = limiter.apply_sync(T0 + 500, batch, None, resend=False)
    assert stats.dropped_hits == 4  # unconfirmed: it may have reached the store
    assert sum(p.hits for p in limiter.end_span(T0 + 1000).pushes) == 0


def test_store_down_fallback_judges_each_span_once() -> None:
    """Retried hits were judged in their own span; re-judging them blocked a calm key."""
    limiter, r = FleetLimiter(), rule(rpu=60, spans=6, unit=Unit.MINUTE)
    for span in range(4):  # 5 hits per 10 s span, far under MAX/N = 10; the store is down
        now = T0 + span * 10_000
        for _ in range(5):
            assert limiter.hit(now, [hit(r)]).code is Code.OK
        limiter.apply_sync(now + 10_000, limiter.end_span(now + 10_000), None)
    state = limiter.keys.get(hit(r).key)
    assert state is not None
    assert state.window_counts().seen == 20  # each span's hits counted once
    assert state.blocked_until == 0
    assert limiter.pending_hits() == 20  # all kept for the store's return


def test_idle_keys_are_pushed_to_a_shared_store() -> None:
    r = rule(rpu=100, spans=2)
    limiter = FleetLimiter()
    limiter.hit(T0, [hit(r)])
    sync(limiter, MemoryStorage(), T0 + 500)  # the hit went out
    batch = limiter.end_span(T0 + 1000)
    assert [p.hits for p in batch.pushes if p.window == T0 // 1000 + 1] == [0]


def test_local_only_applies_the_counts_in_memory() -> None:
    r = rule(rpu=4, spans=2, cooldown_ms=700)
    limiter = LocalLimiter()
    for t in (T0, T0 + 1, T0 + 2):
        assert limiter.hit(t, [hit(r)]).code is Code.OK
    assert limiter.hit(T0 + 600, [hit(r)]).verdicts[0].remaining == 0
    assert limiter.hit(T0 + 601, [hit(r)]).code is Code.OVER_LIMIT  # 5 > 4 in the window
    limiter.sweep(T0 + 1000)
    assert limiter.hit(T0 + 1002, [hit(r)]).code is Code.OVER_LIMIT  # cooldown from T0+601


def test_local_only_blocks_from_the_span_end_that_saw_the_window_over_max() -> None:
    """Span ends do no work per key with a private store: a span's hits are applied when the
    key is next used, as of that span's end, so the block starts where it would have."""
    r = rule(rpu=4, spans=2, cooldown_ms=2000, shadow=True)  # shadow admits over the limit
    limiter = LocalLimiter()
    for t in range(T0, T0 + 6):
        assert limiter.hit(t, [hit(r)]).code is Code.OK
    verdict = limiter.hit(T0 + 1700, [hit(r)]).verdicts[0]  # no end_span call in between
    assert verdict.shadow_refused and verdict.reset_ms == T0 + 500 + 2000 - (T0 + 1700)


def test_local_only_keeps_a_key_through_a_minute_of_silence_then_forgets_it() -> None:
    r = rule(rpu=4, spans=2)
    limiter = LocalLimiter()
    limiter.hit(T0, [hit(r)])
    tracked = []
    for t in range(T0 + 500, T0 + IDLE_MS + SWEEP_EVERY_MS + 1, 500):
        limiter.sweep(t)
        tracked.append((t - T0, len(limiter.keys)))
    assert all(n == 1 for t, n in tracked if t < IDLE_MS)
    assert tracked[-1][1] == 0


def test_local_only_keeps_a_blocked_key_past_its_idle_time() -> None:
    r = rule(rpu=1, spans=2, cooldown_ms=2 * IDLE_MS)
    limiter = LocalLimiter()
    codes = [limiter.hit(T0 + i, [hit(r)]).code for i in range(2)]
    assert codes == [Code.OK, Code.OVER_LIMIT]
    for t in range(T0, T0 + IDLE_MS + 2 * SWEEP_EVERY_MS, SWEEP_EVERY_MS // 2):
        limiter.sweep(t)
    assert limiter.hit(T0 + IDLE_MS + 2 * SWEEP_EVERY_MS, [hit(r)]).code is Code.OVER_LIMIT


def test_an_estimate_over_max_rejects_the_request_but_starts_no_cooldown() -> None:
    limiter, r = FleetLimiter(new_keys_alone=False), rule(rpu=100, spans=2, cooldown_ms=5000)
    limiter.live_nodes = 10  # a new key assumes 10 nodes: each hit stands for 10
    assert [limiter.hit(T0 + i, [hit(r)]).code for i in range(10)] == [Code.OK] * 10
    rejected = limiter.hit(T0 + 100, [hit(r)])
    assert rejected.code is Code.OVER_LIMIT
    # Retry-After: the window's end, when a retry surely fits (the next sync, at T0 + 500,
    # may admit it sooner, but an estimate over MAX most often means the window is full).
    assert rejected.verdicts[0].reset_ms == 900
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.blocked_until == 0 and state.nodes.refused == 1
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((_answer(total=10),)))
    assert limiter.hit(T0 + 501, [hit(r)]).code is Code.OK  # the store says 10 of 100


def test_a_known_count_over_max_starts_the_cooldown() -> None:
    limiter, r = FleetLimiter(), rule(rpu=10, spans=2, cooldown_ms=5000)
    limiter.live_nodes = 2
    for i in range(5):
        limiter.hit(T0 + i, [hit(r)])
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((_answer(total=9),)))
    assert limiter.hit(T0 + 501, [hit(r)]).code is Code.OVER_LIMIT  # 9 + 1 x 2: an estimate
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.blocked_until == 0
    state.nodes.set(1.0)
    assert limiter.hit(T0 + 502, [hit(r)]).code is Code.OK  # 10: the limit
    assert limiter.hit(T0 + 503, [hit(r)]).code is Code.OVER_LIMIT  # 9 + 2 known: over
    assert state.blocked_until == T0 + 503 + 5000


def test_nodes_falls_towards_the_offered_ratio_only_as_far_as_admitted_counts_support() -> None:
    # bug 2: from admitted counts alone, a node that rejected part of its traffic looks like a
    # smaller share of the fleet than it is, and over-estimates nodes, and rejects more.
    limiter, r = FleetLimiter(new_keys_alone=False), rule(rpu=1000, spans=2)
    limiter.live_nodes = 100
    codes = [limiter.hit(T0 + i, [hit(r)]).code for i in range(15)]
    assert codes == [Code.OK] * 10 + [Code.OVER_LIMIT] * 5  # 10 x 100 = 1000, then estimates
    for now, total in ((T0 + 500, 10), (T0 + 1000, 0)):
        limiter.apply_sync(now, limiter.end_span(now), SyncResult((_answer(total),)))
    batch = limiter.end_span(T0 + 1500)
    limiter.apply_sync(T0 + 1500, batch, SyncResult((_answer(0),), totals=(40,)))
    state = limiter.keys.get(hit(r).key)
    # The offered ratio, (40 + 5) / (10 + 5) = 3, is where the estimate may fall; it falls
    # only as far as the admitted ratio, 40 / 10, supports (core/nodes_estimate.py). That one
    # cannot lift it: see tests/unit/core/test_nodes_estimate.py for the runaway of bug 2.
    assert state is not None and state.nodes.value == 40 / 10


def test_a_table_full_of_blocked_keys_decides_a_new_key_untracked() -> None:
    limiter, r = FleetLimiter(max_keys=1), rule(rpu=1)
    limiter.hit(T0, [hit(r, "a")])
    assert limiter.hit(T0, [hit(r, "a")]).code is Code.OVER_LIMIT  # blocked: never evicted
    assert limiter.hit(T0 + 1, [hit(r, "b")]).code is Code.OK
    assert (limiter.untracked, len(limiter.keys)) == (1, 1)
