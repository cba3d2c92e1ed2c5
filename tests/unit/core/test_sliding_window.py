"""The sliding window (core/sliding_window.py) on a fake clock: local-only decisions equal the
exact span-weighted reference's; a fleet node decides from the store's span totals plus its own
unconfirmed hits times `nodes`."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    Limiter,
    LocalLimiter,
    PushResult,
    SyncResult,
)
from ratelimit_sidecar.core.spans import span_end, span_number
from ratelimit_sidecar.service.fast_path import OneCounted
from simulator.exact.sliding_window import ExactSlidingWindow
from tests.unit.core.rules import hit, rule
from tests.unit.core.trailing import (
    LOG,
    T0,
    WINDOW,
    PromptStore,
    SpanStore,
    boundary_bursts,
    random_trace,
    span_end_bursts,
    trailing_rule,
    worst_trailing_count,
)
from tests.unit.service import test_fast_path as counted_alone


def replay(
    limiter: Limiter, r: Rule, trace: list[tuple[int, int]], store: PromptStore | None = None
) -> list[int]:
    """Every request of `trace` to `limiter` and to the exact reference: same decision, and
    the same remaining, reset and Retry-After. Returns the times of admitted hits. A fleet
    node syncs with `store` at every span end first."""
    assert r.limit is not None
    exact = ExactSlidingWindow(r.limit.requests_per_unit, r.limit.window_ms, r.limit.spans)
    admitted: list[int] = []
    for now, hits in trace:
        if store is not None:
            store.sync_until(now)
        wait = None if exact.allows(now, hits) else exact.wait_ms(now, hits)
        verdict = limiter.hit(now, [hit(r, hits=hits)]).verdicts[0]
        assert (verdict.code is Code.OK) == exact.hit(now, hits), (now - T0, hits)
        if verdict.code is Code.OK:
            admitted += [now] * hits
            assert verdict.remaining == max(0, int(r.limit.requests_per_unit - exact.count(now)))
            assert verdict.reset_ms == exact.reset_ms(now), now - T0
        else:
            assert verdict.reset_ms == (wait if wait is not None else r.limit.window_ms)
    return admitted


# -- local-only mode: exact ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_local_decisions_equal_the_exact_reference_on_random_traces(seed: int) -> None:
    r = trailing_rule(WINDOW, rpu=[1, 7, 20][seed % 3], spans=[1, 3, 4, 6, 7, 10][seed % 6])
    replay(LocalLimiter(), r, list(random_trace(seed, 800, mean_gap_ms=40)))


def test_max_at_a_windows_end_then_max_at_the_next_start_admits_about_max() -> None:
    r = trailing_rule(WINDOW, rpu=60, spans=6)
    admitted = replay(LocalLimiter(), r, list(boundary_bursts(60, 1000, windows=5)))
    assert len(admitted) == 60 * 5  # one burst a window: the one right after it waits
    assert worst_trailing_count(admitted, 1000) == 60  # no trailing window saw more


def test_the_weightings_worst_case_stays_under_two_max() -> None:
    """Hits at a span's very end count as spread over it: a trailing window can then hold up
    to MAX plus what the oldest span's weight leaves room for (measured, see the report)."""
    r = trailing_rule(WINDOW, rpu=50, spans=4)
    admitted = replay(LocalLimiter(), r, list(span_end_bursts(50, 1000, 4, count=3)))
    worst = worst_trailing_count(admitted, 1000)
    assert 50 < worst < 2 * 50


def probe(r: Rule, sent: list[tuple[int, int]], now: int, hits: int) -> Code:
    """The answer to `hits` at `now` after the requests `sent`, from a limiter of its own."""
    limiter = LocalLimiter()
    for then, then_hits in sent:
        limiter.hit(then, [hit(r, hits=then_hits)])
    return limiter.hit(now, [hit(r, hits=hits)]).code


def test_retry_after_is_the_first_moment_the_request_fits() -> None:
    r = trailing_rule(WINDOW, rpu=12, spans=5)
    limiter, sent, checked = LocalLimiter(), [], 0
    for now, hits in random_trace(99, 400, mean_gap_ms=30):
        verdict = limiter.hit(now, [hit(r, hits=hits)]).verdicts[0]
        sent.append((now, hits))
        if verdict.code is Code.OK or checked > 40:
            continue
        checked += 1
        retry = now + verdict.reset_ms
        assert verdict.reset_ms > 0
        assert probe(r, sent, retry - 1, hits) is Code.OVER_LIMIT
        assert probe(r, sent, retry, hits) is Code.OK
    assert checked > 10


def test_counts_outlive_the_window_they_were_made_in() -> None:
    """The fixed window's bookkeeping drops a finished window's pending hits; here they stay
    counted while their spans are in the trailing window."""
    r = trailing_rule(WINDOW, rpu=10, spans=4)
    limiter = LocalLimiter()
    assert limiter.hit(T0 + 999, [hit(r, hits=10)]).code is Code.OK  # in span 3
    refusal = limiter.hit(T0 + 1500, [hit(r)]).verdicts[0]  # next window: span 3 is whole
    assert (refusal.code, refusal.reset_ms) == (Code.OVER_LIMIT, 274)
    # From 1750 span 3 leaves, weighted (1999 - now) / 250: 1 more fits from 9 x 250 / 10.
    assert limiter.hit(T0 + 1773, [hit(r)]).code is Code.OVER_LIMIT
    verdict = limiter.hit(T0 + 1774, [hit(r)]).verdicts[0]
    assert (verdict.code, verdict.remaining, verdict.reset_ms) == (Code.OK, 0, 225)


def test_a_cooldown_blocks_and_retry_after_is_the_blocks_end() -> None:
    r = trailing_rule(WINDOW, rpu=3, spans=2, cooldown_ms=5000)
    limiter = LocalLimiter()
    codes = [limiter.hit(T0 + i, [hit(r)]).code for i in range(3)]
    refusal = limiter.hit(T0 + 10, [hit(r)]).verdicts[0]
    assert codes == [Code.OK] * 3
    assert (refusal.code, refusal.reset_ms) == (Code.OVER_LIMIT, 5000)
    assert limiter.hit(T0 + 5009, [hit(r)]).verdicts[0].reset_ms == 1  # the block holds
    assert limiter.hit(T0 + 5010, [hit(r)]).code is Code.OK


def test_shadow_rules_answer_ok_marked_shadowed_and_near_limit_from_80_percent() -> None:
    r = trailing_rule(WINDOW, rpu=5, shadow=True)
    limiter = LocalLimiter()
    verdicts = [limiter.hit(T0 + i, [hit(r)]).verdicts[0] for i in range(7)]
    assert all(v.code is Code.OK for v in verdicts)
    assert [v.shadow_refused for v in verdicts] == [False] * 5 + [True] * 2
    assert [v.near_limit for v in verdicts[:5]] == [False, False, False, True, True]


def test_more_hits_than_max_never_fit_and_quota_can_be_given_back() -> None:
    r = trailing_rule(WINDOW, rpu=5)
    limiter = LocalLimiter()
    too_many = limiter.hit(T0, [hit(r, hits=6)]).verdicts[0]
    assert (too_many.code, too_many.reset_ms) == (Code.OVER_LIMIT, 1000)
    assert limiter.hit(T0, [hit(r, hits=5)]).code is Code.OK
    limiter.hit(T0 + 1, [hit(r, hits=-2)])
    assert limiter.hit(T0 + 2, [hit(r, hits=2)]).verdicts[0].remaining == 0


def test_an_evicted_key_resumes_its_count() -> None:
    r = trailing_rule(WINDOW, rpu=10, unit=Unit.MINUTE)
    for limiter in (LocalLimiter(max_keys=1), FleetLimiter(max_keys=1)):
        for i in range(8):
            limiter.hit(T0 + i, [hit(r, "heavy")])
        limiter.hit(T0 + 40_000, [hit(r, "other")])  # evicts "heavy"
        codes = [limiter.hit(T0 + 50_000 + i, [hit(r, "heavy")]).code for i in range(3)]
        assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT], type(limiter).__name__


def test_a_rule_reloaded_with_another_algorithm_starts_a_fresh_counter() -> None:
    fixed = rule(rpu=2, cooldown_ms=1)
    limiter = LocalLimiter()
    assert [limiter.hit(T0, [hit(fixed)]).code for _ in range(3)][-1] is Code.OVER_LIMIT
    assert fixed.limit is not None
    sliding = Rule("d", fixed.path, _with_algorithm(fixed.limit))
    assert limiter.hit(T0 + 1, [hit(sliding, hits=2)]).code is Code.OK
    assert limiter.hit(T0 + 2, [hit(sliding)]).code is Code.OVER_LIMIT
    same_again = Rule("d", fixed.path, _with_algorithm(fixed.limit))  # equal: counts kept
    assert limiter.hit(T0 + 3, [hit(same_again)]).code is Code.OVER_LIMIT


def test_several_limits_mix_sliding_and_fixed_windows() -> None:
    per_second = RateLimit(3, Unit.SECOND, spans=4, algorithm=WINDOW)
    per_minute = RateLimit(5, Unit.MINUTE, cooldown_ms=1)
    r = Rule("d", (("k", ""),), limits=(per_second, per_minute))
    limiter = LocalLimiter()
    first = [limiter.hit(T0 + i, [hit(r)]) for i in range(4)]
    assert [d.code for d in first] == [Code.OK] * 3 + [Code.OVER_LIMIT]
    assert first[3].verdicts[0].limit is per_second
    later = [limiter.hit(T0 + 1500 + i, [hit(r)]).verdicts[0] for i in range(3)]
    assert [v.code for v in later] == [Code.OK, Code.OK, Code.OVER_LIMIT]
    assert later[0].limit is per_minute  # fewest remaining: the minute's 1 vs the second's 2
    assert later[2].limit is per_minute


# -- fleet mode: the store's span totals plus own hits times nodes ---------------------------


def test_the_estimate_is_the_stores_spans_plus_own_unconfirmed_hits_times_nodes() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4)
    limiter = _fleet_of(nodes=2)
    assert limiter.hit(T0 + 10, [hit(r, hits=10)]).verdicts[0].remaining == 80  # 10 x 2
    batch = limiter.end_span(T0 + 250)
    assert [(p.hits, p.span) for p in batch.pushes] == [(10, span_number(T0, _limit(r)))]
    # The fleet counted 50 in span 0 (this node's 10 among them).
    limiter.apply_sync(T0 + 250, batch, SyncResult((PushResult(50, 0, spans=(0, 0, 0, 50)),)))
    assert limiter.hit(T0 + 260, [hit(r, hits=5)]).verdicts[0].remaining == 40  # 50 + 5 x 2
    refusal = limiter.hit(T0 + 270, [hit(r, hits=21)]).verdicts[0]  # 60 + 21 x 2 > 100
    # Fits once span 0's weight is down to 48/50 in the next window: 1249 - 240 ms.
    assert (refusal.code, refusal.reset_ms) == (Code.OVER_LIMIT, 1009 - 270)
    assert limiter.hit(T0 + 280, [hit(r, hits=20)]).verdicts[0].remaining == 0


def test_the_oldest_span_is_weighted_as_it_leaves() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4)
    limiter = _fleet_of(nodes=1)
    limiter.hit(T0 + 10, [hit(r)])
    batch = limiter.end_span(T0 + 250)
    limiter.apply_sync(T0 + 250, batch, SyncResult((PushResult(81, 0, spans=(0, 0, 0, 81)),)))
    # At 1100, span 0 has 149 of its 250 ms in the window: 81 x 149 / 250 = 48.3, plus 1.
    assert limiter.hit(T0 + 1100, [hit(r)]).verdicts[0].remaining == 50
    # ... and the answer says when quota comes back: span 0 is gone at 1249.
    assert limiter.hit(T0 + 1101, [hit(r, hits=0)]).verdicts[0].reset_ms == 148


def test_store_failure_keeps_own_hits_scaled_until_an_answer_confirms_them() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4, cooldown_ms=300)
    limiter = _fleet_of(nodes=4)
    limiter.hit(T0 + 10, [hit(r, hits=20)])
    stats = limiter.apply_sync(T0 + 250, limiter.end_span(T0 + 250), None)
    assert stats.failed and stats.blocked_keys == 0  # 20 x 4 = 80: within MAX
    assert limiter.hit(T0 + 260, [hit(r, hits=5)]).verdicts[0].remaining == 0  # 25 x 4
    stats = limiter.apply_sync(T0 + 500, limiter.end_span(T0 + 500), None)
    refusal = limiter.hit(T0 + 510, [hit(r)]).verdicts[0]
    assert refusal.code is Code.OVER_LIMIT and refusal.reset_ms > 300  # no block: not over
    batch = limiter.end_span(T0 + 750)  # the store is back: the unsent hits go out
    assert sum(p.hits for p in batch.pushes) == 25
    limiter.apply_sync(T0 + 750, batch, SyncResult((PushResult(25, 0, spans=(0, 0, 0, 25)),)))
    # Confirmed, but the other nodes may not have pushed that span yet: until the next answer
    # it counts this node's 25 times 4, and a refusal on that estimate starts no block.
    assert limiter.hit(T0 + 760, [hit(r)]).code is Code.OVER_LIMIT
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.blocked_until == 0
    batch = limiter.end_span(T0 + 1000)  # nothing more from anyone: the span holds 25
    limiter.apply_sync(T0 + 1000, batch, SyncResult((PushResult(25, 0, spans=(0, 0, 25, 0)),)))
    # The span before held 25 in all, this node's own 25: a new key learns it has most of the
    # traffic (see the next test; 25 / (25 - 5) = 1.25 nodes): 100 - 25 - 1 x 1.25.
    assert limiter.hit(T0 + 1010, [hit(r)]).verdicts[0].remaining == 73


@pytest.mark.parametrize(("edge", "held_elsewhere"), [(False, 0), (True, 2)])
def test_a_new_key_lowers_its_even_split_guess_from_a_span_every_node_has_pushed(
    edge: bool, held_elsewhere: int
) -> None:
    """At the edge the 2 other nodes may each hold a hit of the key unseen (core/quiet_keys.py):
    the fleet's spans are taken that much larger."""
    r = _at_edge(trailing_rule(WINDOW, rpu=100, spans=4), edge)
    limiter = _fleet_of(nodes=3)
    limiter.hit(T0 + 10, [hit(r, hits=4)])  # 60 % of a span's 7: too few to learn from
    batch = limiter.end_span(T0 + 250)
    limiter.apply_sync(T0 + 250, batch, SyncResult((PushResult(4, 0, spans=(0, 0, 0, 4)),)))
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.nodes.value == 3  # the pushed span may still be growing
    limiter.hit(T0 + 260, [hit(r, hits=26)])
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(33, 0, spans=(0, 0, 7, 26)),)))
    assert state.nodes.value == 3  # 4 own hits, taken one deviation low: under MIN_EARLY_OWN
    limiter.hit(T0 + 510, [hit(r)])
    batch = limiter.end_span(T0 + 750)
    limiter.apply_sync(T0 + 750, batch, SyncResult((PushResult(77, 0, spans=(0, 7, 43, 1)),)))
    sure = 30 - 30**0.5  # own 4 + 26, one standard deviation low; fleet 7 + 43
    assert state.nodes.value == pytest.approx((50 + held_elsewhere) / sure)
    assert state.nodes.check == pytest.approx((50 + held_elsewhere) / sure)


def test_a_span_never_raises_the_guess_nor_overrides_a_learnt_window() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4)
    limiter = _fleet_of(nodes=3)
    limiter.hit(T0 + 10, [hit(r, hits=5)])
    limiter.apply_sync(T0 + 250, limiter.end_span(T0 + 250), None)  # failed: kept unsent
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(5, 0, spans=(0, 0, 0, 5)),)))
    limiter.hit(T0 + 510, [hit(r, hits=5)])
    batch = limiter.end_span(T0 + 750)
    answer = PushResult(55, 0, spans=(0, 0, 50, 5))  # the span before: 50 in all, 5 own
    limiter.apply_sync(T0 + 750, batch, SyncResult((answer,)))
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.nodes.value == 3  # 10 > 3: an even split is no lower bound
    state.nodes.ratio = 2.0  # a finished window has been learnt
    limiter.hit(T0 + 760, [hit(r, hits=5)])
    batch = limiter.end_span(T0 + 1000)
    limiter.apply_sync(T0 + 1000, batch, SyncResult((PushResult(5, 0, spans=(0, 5, 5, 5)),)))
    assert state.nodes.value == 3  # windows teach it from now on


def test_a_fallback_over_max_blocks_when_a_cooldown_is_set() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4, cooldown_ms=300)
    limiter = _fleet_of(nodes=1)
    limiter.hit(T0 + 10, [hit(r, hits=100)])
    state = limiter.keys.get(hit(r).key)
    assert state is not None
    state.nodes.set(2.0)  # the fleet grew: 100 x 2 > MAX
    stats = limiter.apply_sync(T0 + 250, limiter.end_span(T0 + 250), None)
    assert stats.blocked_keys == 1
    # Blocked until T0 + 550, but the 100 hits (x 2) of span 0 leave room for one more (x 2)
    # only once 98/200 of that span is left inside the window: at T0 + 1249 - 122 = T0 + 1127.
    assert limiter.hit(T0 + 260, [hit(r)]).verdicts[0].reset_ms == 1127 - 260


def test_a_window_boundary_roll_before_the_sync_loses_no_span() -> None:
    """A request at a window's first ms rolls the key before the span-end sync: the last
    span's hits go out as a retry for the finished window, whose spans still count."""
    r = trailing_rule(WINDOW, rpu=10, spans=4)
    store, limiter = SpanStore(), _fleet_of(nodes=1)
    limiter.hit(T0 + 990, [hit(r, hits=10)])
    assert limiter.hit(T0 + 1000, [hit(r)]).code is Code.OVER_LIMIT  # before the sync
    batch = limiter.end_span(T0 + 1000)
    assert [p.window for p in batch.pushes] == [T0 // 1000]  # the retry alone
    limiter.apply_sync(T0 + 1000, batch, store.execute(batch))
    state = limiter.keys.get(hit(r).key)
    own = state.span_state().own if state is not None else None
    assert own is not None and own.total() == 0  # confirmed: counted once, in the store's spans
    assert limiter.hit(T0 + 1001, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 1999, [hit(r)]).code is Code.OK  # span 3 has left


def test_a_read_without_hits_asks_for_the_latest_spans() -> None:
    r = trailing_rule(WINDOW, rpu=100, spans=4)
    limiter = _fleet_of(nodes=1)
    limiter.hit(T0 + 10, [hit(r)])
    limiter.apply_sync(T0 + 250, batch := limiter.end_span(T0 + 250), SpanStore().execute(batch))
    batch = limiter.end_span(T0 + 750)
    assert [p.span for p in batch.pushes] == [span_number(T0 + 749, _limit(r))]


def test_one_node_with_a_prompt_store_decides_as_the_exact_reference() -> None:
    for seed in range(4):
        r = trailing_rule(WINDOW, rpu=[5, 16][seed % 2], spans=[3, 4][seed // 2])
        limiter = _fleet_of(nodes=1)
        replay(limiter, r, list(random_trace(seed, 600, mean_gap_ms=40)), PromptStore(limiter))


def _fleet_of(nodes: int) -> FleetLimiter:
    limiter = FleetLimiter()
    batch = limiter.end_span(T0)  # nothing tracked yet: learns the fleet's size
    limiter.apply_sync(T0, batch, SyncResult(live_nodes=nodes))
    return limiter


def _at_edge(r: Rule, edge: bool) -> Rule:
    limit = replace(_limit(r), edge=edge)
    return replace(r, limit=limit, limits=(limit,))


def _limit(r: Rule) -> RateLimit:
    assert r.limit is not None
    return r.limit


def _with_algorithm(limit: RateLimit) -> RateLimit:
    return RateLimit(limit.requests_per_unit, limit.unit, spans=limit.spans, algorithm=WINDOW)


def run_fleet(
    nodes: int, offered_per_second: int, seconds: int, seed: int, bursts: bool = False
) -> list[int]:
    """`nodes` fleet nodes sharing one key through a prompt store (each syncs at every span
    end, in a random order); requests arrive at random times on random nodes, plus, with
    `bursts`, MAX spread over the nodes around every window boundary. The admitted times."""
    rnd, r, store = random.Random(seed), trailing_rule(WINDOW, rpu=100, spans=6), SpanStore()
    fleet = [_fleet_of(nodes) for _ in range(nodes)]
    requests = [
        (T0 + rnd.randrange(seconds * 1000), rnd.randrange(nodes))
        for _ in range(offered_per_second * seconds)
    ]
    if bursts:
        requests += [
            (T0 + w * 1000 + rnd.randrange(-3, 3), k % nodes)
            for w in range(1, seconds)
            for k in range(200)
        ]
    admitted, synced = [], T0
    for now, node in sorted(requests):
        while (end := span_end(synced, 1000, 6)) <= now:
            for limiter in rnd.sample(fleet, nodes):
                batch = limiter.end_span(end)
                limiter.apply_sync(end, batch, store.execute(batch, live_nodes=nodes))
            synced = end
        if fleet[node].hit(now, [hit(r)]).code is Code.OK:
            admitted.append(now)
    return admitted


@pytest.mark.parametrize(
    ("offered", "bursts"), [(300, False), (500, False), (100, True)], ids=["3x", "5x", "bursts"]
)
def test_a_fleet_of_four_stays_near_max_in_every_trailing_window(
    offered: int, bursts: bool
) -> None:
    """Four nodes, MAX 100 per second: the fleet's admitted hits, counted by the exact
    reference (span-weighted) and by a true trailing window, stay within a few percent of MAX.
    Measured over seeds 0-9: weighted at most 105 (3x offered), 104 (5x), 101 (bursts); true
    trailing window at most 105, 107, 115; admitted 98-99 per second (92-93 with bursts)."""
    admitted = run_fleet(4, offered, seconds=12, seed=offered, bursts=bursts)
    exact = ExactSlidingWindow(100, 1000, 6)
    exact.times, exact.hits = admitted, [1] * len(admitted)
    worst_weighted = max(exact.count(t) for t in sorted(set(admitted)))
    assert worst_weighted <= 108
    assert worst_trailing_count(admitted, 1000) <= 120
    assert 85 * 12 <= len(admitted) <= 101 * 12


def test_the_reference_weighs_the_leaving_span_by_its_milliseconds_still_inside() -> None:
    exact = ExactSlidingWindow(100, 1000, 3)  # spans of 334, 333, 333 ms
    assert exact.span_of(T0 + 333) == (T0, T0 + 334)
    assert exact.span_of(T0 + 334) == (T0 + 334, T0 + 667)
    assert exact.hit(T0 + 333, 30)
    assert exact.count(T0 + 999) == 30  # the span starts inside (T0 - 1, T0 + 999]
    assert exact.count(T0 + 1000) == Fraction(30 * 333, 334)  # T0 itself has left
    assert exact.count(T0 + 1333) == 0
    assert exact.reset_ms(T0 + 1000) == 333


SLIDING_RULES = (
    trailing_rule(WINDOW, rpu=5, cooldown_ms=300),
    trailing_rule(LOG, rpu=1, key="x"),
    trailing_rule(WINDOW, rpu=40, spans=4, key="y"),
)
# A shared store never counts a sliding log (the configuration refuses it): its window twin.
SHARED_RULES = (SLIDING_RULES[0], trailing_rule(WINDOW, rpu=1, key="x"), SLIDING_RULES[2])


@settings(max_examples=100, deadline=None)
@given(counted_alone.steps, st.sampled_from([2, 4, 100]), st.booleans())
def test_the_counted_descriptor_alone_decides_as_the_whole_request(
    script: list[tuple[int, tuple[int, str, int, int, bool]]], max_keys: int, shared: bool
) -> None:
    """As tests/unit/service/test_fast_path.py checks for the fixed window."""
    kind = FleetLimiter if shared else LocalLimiter
    rules = SHARED_RULES if shared else SLIDING_RULES
    alone, whole, now = kind(max_keys), kind(max_keys), T0
    kept: dict[object, OneCounted] = {}
    for dt, (index, value, count, companions, first) in script:
        now += dt
        if index < 0:
            counted_alone.end_span(alone, now, count)
            counted_alone.end_span(whole, now, count)
            continue
        counted, others = (
            hit(rules[index], value, count),
            counted_alone.COMPANIONS[companions],
        )
        request = [counted, *others] if first else [*others, counted]
        at = 0 if first else len(others)
        if companions != 3:  # one counted descriptor: the fast path
            mine = counted_alone.fast_decision(alone, now, request, at, kept)
        else:
            mine = alone.hit(now, request)
        assert mine == whole.hit(now, request)
        assert counted_alone.snapshot(alone) == counted_alone.snapshot(whole)
