"""RLQS leases of a sliding window that says `consistency: strict`, or `edge` while its pace is
near MAX (core/quota_usage.py, core/spancounts.py `LeasedSpans`), counted through the limiter
against the simulator's store, on a fake clock."""

from __future__ import annotations

import math
from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.core.fleet import push_span
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.quota_assign import Action, QuotaPolicy
from ratelimit_sidecar.core.quota_lease import Free, Lease
from ratelimit_sidecar.core.quota_usage import BucketQuota
from ratelimit_sidecar.core.quota_windows import leasable
from ratelimit_sidecar.core.spancounts import LeasedSpans
from ratelimit_sidecar.core.types import Push, SyncBatch
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
SPAN_MS = 2_000  # 240 per 10 s in 5 spans
POLICY = QuotaPolicy()


def trailing_rule(*, strict: bool = True, edge: bool = False) -> Rule:
    limit = RateLimit(
        240,
        Unit.SECOND,
        10,
        algorithm=AlgorithmName.SLIDING_WINDOW,
        spans=5,
        strict=strict,
        edge=edge and not strict,
    )
    return Rule("d", (("k", ""),), limit)


def sync(limiter: FleetLimiter, store: MemoryStorage, now_ms: int) -> None:
    batch = limiter.end_span(now_ms)
    limiter.apply_sync(now_ms, batch, store.execute(batch))


def stored_spans(store: MemoryStorage, state: KeyState, now_ms: int) -> tuple[int, ...]:
    """The store's counts of the window's spans ending with the one at `now_ms` (a read)."""
    span = now_ms // SPAN_MS
    read = Push(state.key, now_ms // 10_000, 0, state.limit, span)
    return store.execute(SyncBatch(now_ms, [read])).pushes[0].spans


def leased(
    now_ms: int, r: Rule | None = None
) -> tuple[FleetLimiter, MemoryStorage, BucketQuota, Rule, KeyState]:
    """A gateway's first lease, the store's count read (4 live nodes, 60 counted by others)."""
    limiter, store, r = FleetLimiter(), MemoryStorage(), r or trailing_rule()
    limiter.live_nodes = 4
    quota = BucketQuota()
    quota.report(limiter, hit(r, hits=1), now_ms)
    state = limiter.keys.get(hit(r).key)
    assert state is not None
    others = Push(state.key, state.window, 60, state.limit, now_ms // SPAN_MS)
    store.execute(SyncBatch(now_ms, [others]))
    sync(limiter, store, now_ms)
    quota.recheck(limiter, hit(r, hits=0), now_ms + 100)
    sync(limiter, store, now_ms + 100)
    return limiter, store, quota, r, state


def test_a_strict_or_edge_trailing_window_is_leasable_an_eventual_one_is_not() -> None:
    """At the edge only up to two reports long: in a minute a report's pace is not the window's."""
    assert leasable(trailing_rule(), POLICY)
    assert leasable(trailing_rule(strict=False, edge=True), POLICY)
    assert not leasable(trailing_rule(strict=False), POLICY)
    minute = RateLimit(1440, Unit.MINUTE, algorithm=AlgorithmName.SLIDING_WINDOW, spans=6)
    assert leasable(Rule("d", (("k", ""),), replace(minute, strict=True)), POLICY)
    assert not leasable(Rule("d", (("k", ""),), replace(minute, edge=True)), POLICY)


def surged() -> tuple[FleetLimiter, MemoryStorage, BucketQuota, Rule, KeyState, int]:
    """An edge trailing bucket, plain at a quiet pace (6 in 5 s on 4 nodes: 48 a window), then
    a report at twice MAX a window (60 offered in 5 s): its plain bucket's size is returned."""
    limiter, store, r = FleetLimiter(), MemoryStorage(), trailing_rule(strict=False, edge=True)
    limiter.live_nodes, quota = 4, BucketQuota()
    first = quota.report(limiter, hit(r, hits=1), T0 + 10)
    quota.report(limiter, hit(r, hits=5), T0 + 5_010)
    assert first is not None and first.bucket is not None and not quota.trail.leasing
    state = limiter.keys.get(hit(r).key)
    assert state is not None and quota.sent is not None and quota.sent.bucket is not None
    plain = quota.sent.bucket.max_tokens
    sync(limiter, store, T0 + 5_010)
    gone = quota.report(limiter, hit(r, hits=30), T0 + 10_010, denied=30)
    assert gone is not None and gone.action is Action.ABANDON and quota.trail.leasing
    return limiter, store, quota, r, state, plain


def test_a_surge_hands_a_plain_bucket_over_to_a_lease_that_waits_for_the_others() -> None:
    """The plain bucket is abandoned (a lease is built full in its place), and for a report
    period the other gateways' plain buckets count as spent: each as much as this gateway's
    pace until then, or its plain bucket whole."""
    _, _, quota, _, _, plain = surged()
    free = Free(240, 200, 10_000, 1000, 4)
    waited = quota._after_handover(free, T0 + 11_010)  # 4 s of the report period left
    assert free.free - waited.free == 3 * max(plain, math.ceil(quota.rate * 4_000))
    assert quota._after_handover(free, T0 + 15_010) is free  # the others have reported since


def test_a_window_after_the_surge_the_bucket_is_plain_again_its_lease_given_back() -> None:
    """What the lease counted beyond what was reported spent comes off the store: the plain
    assignments count the bucket's usage when it is reported."""
    limiter, store, quota, r, state, _ = surged()
    anew = quota.report(limiter, hit(r, hits=1), T0 + 10_020)  # the request making it anew
    sync(limiter, store, T0 + 10_020)
    quota.recheck(limiter, hit(r, hits=0), T0 + 10_200)
    assert anew is not None and quota.lease.target() > quota.lease.used
    for at in range(T0 + 15_020, T0 + 25_020, 5_000):
        quota.report(limiter, hit(r, hits=2), at)
        sync(limiter, store, at)
    assert quota.trail.leasing  # a window after the pace was last near
    outstanding = quota.lease.target() - quota.lease.used
    before = sum(stored_spans(store, state, T0 + 25_020))
    quota.report(limiter, hit(r, hits=2), T0 + 25_020)  # spent from the lease
    sync(limiter, store, T0 + 25_020)
    assert not quota.trail.leasing and outstanding > 2
    assert sum(stored_spans(store, state, T0 + 25_020)) == before - (outstanding - 2)


def test_a_trailing_windows_lease_is_at_most_an_even_part_of_what_is_free() -> None:
    """A fixed window's gateway may take up to its fair share of MAX while it holds less; in a
    trailing window little is free at any time, and 8 such shares capped by it took 8 times
    what was free."""
    lease = Lease()
    lease.roll(0)
    lease.report(0, T0, 0.06)
    fixed = lease.decide(Free(240, 40, 10_000, 1000, 8), T0)
    trailing = lease.decide(Free(240, 40, 10_000, 1000, 8, resets=False), T0)
    assert (fixed.tokens, trailing.tokens) == (30, 5)


def test_unreported_leased_tokens_move_to_the_current_span_at_each_sync() -> None:
    """Counted where it was handed out, a token spent later left the trailing window before
    the request it admitted: what the bucket may still spend moves to the span of each sync,
    in one round trip."""
    limiter, store, quota, _, state = leased(T0 + 10)
    first = stored_spans(store, state, T0 + 100)[-1]
    outstanding = quota.lease.target() - quota.lease.used
    assert first >= outstanding > 1
    sync(limiter, store, T0 + SPAN_MS)  # the next span: nothing reported since
    spans = stored_spans(store, state, T0 + SPAN_MS)
    assert spans[-2:] == (first - outstanding, outstanding)


def test_tokens_reported_spent_stay_where_they_were_counted() -> None:
    limiter, store, quota, r, state = leased(T0 + 10)
    outstanding = quota.lease.target() - quota.lease.used
    quota.report(limiter, hit(r, hits=5), T0 + 1_000)  # 5 spent, in the lease's span
    sync(limiter, store, T0 + SPAN_MS)
    spans = stored_spans(store, state, T0 + SPAN_MS)
    left = quota.lease.target() - quota.lease.used
    assert left <= outstanding - 5
    assert spans[-1] == left and spans[-2] >= 60 + 1 + 5


def test_a_lease_given_back_comes_off_the_store_once_confirmed() -> None:
    """A lease is confirmed within milliseconds: given back only while unconfirmed (as a
    request's hits are), almost none of it went back."""
    limiter, store, _, _, state = leased(T0 + 10)
    before = sum(stored_spans(store, state, T0 + 200))
    limiter.count_lease(state, -10, T0 + 200)
    assert limiter.leased_count(state, T0 + 200) == before - 10
    sync(limiter, store, T0 + 200)
    assert sum(stored_spans(store, state, T0 + 200)) == before - 10


def test_a_leased_counter_pushes_and_reads_the_span_its_leases_sit_in() -> None:
    """At a span's first ms, before its span end's sync: a given-back lease is pushed in the span
    it was counted in (a request's hits go to the span that ended), and a read asks for the
    span now, where the others' leases moved (a request's read, the span that ended)."""
    limiter, _, _, _, state = leased(T0 + 10)
    at = T0 + SPAN_MS
    assert push_span(state, at, at) == at // SPAN_MS
    limiter.count_lease(state, -5, at)
    assert push_span(state, at, at) == at // SPAN_MS


def test_a_trailing_windows_lease_goes_on_across_a_window_end() -> None:
    """No window end abandons it (a fixed window's does): its counts stay where they are."""
    limiter, store, quota, r, _ = leased(T0 + 8_000)
    sync(limiter, store, T0 + 10_000)
    kept = quota.recheck(limiter, hit(r, hits=0), T0 + 10_050)
    assert kept is None or kept.action is not Action.ABANDON
    assert not quota.abandoned


def test_leased_spans_keep_reported_tokens_and_move_the_rest() -> None:
    spans = LeasedSpans()
    spans.counted(5, 10)
    spans.owe(1, 4, T0)  # 6 reported spent: they stay in span 5
    assert spans.move_to(6, T0, 10_000, 0) == [(5, -4), (6, 4)]
    spans.counted(6, 3)
    spans.owe(1, 7, T0)
    assert spans.move_to(7, T0, 10_000, 0) == [(6, -7), (7, 7)]


def test_tokens_in_a_span_no_window_counts_any_more_are_counted_again_only() -> None:
    spans = LeasedSpans()
    spans.counted(5, 10)
    spans.owe(1, 10, T0)
    assert spans.move_to(12, T0, 10_000, 6) == [(12, 10)]


def test_a_bucket_not_heard_of_for_a_window_stays_where_it_was_counted() -> None:
    """Envoy dropped it: what it held is not spent any more."""
    spans = LeasedSpans()
    spans.counted(5, 10)
    spans.owe(1, 10, T0)
    assert spans.move_to(6, T0 + 10_001, 10_000, 0) == []
