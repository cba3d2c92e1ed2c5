"""The RLQS assignment rule (core/quota_assign.py) and a report through the limiter
(core/quota_usage.py), on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter, LocalLimiter
from ratelimit_sidecar.core.quota_assign import (
    Action,
    Assignment,
    KeyView,
    QuotaPolicy,
    TokenBucket,
    abandoned,
    assign,
    held_tokens,
)
from ratelimit_sidecar.core.quota_counters import combine, report_usage
from ratelimit_sidecar.core.quota_settle import kept, settle
from ratelimit_sidecar.core.quota_usage import BucketQuota
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
MINUTE_100 = RateLimit(100, Unit.MINUTE)
SLIDING_100 = RateLimit(100, Unit.MINUTE, algorithm=AlgorithmName.SLIDING_WINDOW)
MINUTE = QuotaPolicy().edge_over_ms
POLICY = QuotaPolicy()


def bucket_of(assignment: Assignment) -> TokenBucket:
    assert assignment.action is Action.TOKEN_BUCKET and assignment.bucket is not None
    return assignment.bucket


def test_a_window_gets_the_gateways_share_of_what_is_left_refilled_by_the_server() -> None:
    """A window's room frees only when hits leave it: Envoy's bucket gets the share of what is
    left, a token per fill interval (1.40 never refills without one), and a recheck when the
    window frees room (here its reset)."""
    got = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0, reset_ms=45_000), T0)
    assert bucket_of(got) == TokenBucket(max_tokens=40, tokens_per_fill=1, fill_interval_s=60)
    assert (got.ttl_s, got.issued_ms, got.recheck_ms) == (POLICY.ttl_s, T0, T0 + 45_000)
    soon = assign(KeyView(MINUTE_100, remaining=80, reset_ms=10), T0)
    assert soon.recheck_ms == T0 + POLICY.min_recheck_ms  # Envoy's TTLs are whole seconds
    synced = assign(KeyView(MINUTE_100, remaining=80, reset_ms=45_000, sync_ms=4000), T0)
    assert synced.recheck_ms == T0 + 4250  # the sync brings the other gateways' counts


def test_a_token_bucket_refills_at_the_gateways_share_of_the_rate() -> None:
    limit = RateLimit(100, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET, burst=200)
    got = assign(KeyView(limit, remaining=160, nodes=2.0, reset_ms=3000), T0)
    assert bucket_of(got) == TokenBucket(max_tokens=80, tokens_per_fill=50, fill_interval_s=60)
    assert got.recheck_ms == 0  # Envoy refills it itself


def test_streams_of_one_node_split_its_share() -> None:
    limit = RateLimit(100, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET)
    got = assign(KeyView(limit, remaining=80, nodes=2.0), T0, streams=2)
    assert bucket_of(got) == TokenBucket(max_tokens=20, tokens_per_fill=25, fill_interval_s=60)


def test_a_small_share_keeps_whole_numbers_by_lengthening_the_fill_interval() -> None:
    """10 per 10 s over 3 nodes: 1/3 token a second, as 33 tokens per 100 s (Envoy refills
    continuously at tokens_per_fill / fill_interval)."""
    limit = RateLimit(10, Unit.SECOND, 10, algorithm=AlgorithmName.TOKEN_BUCKET)
    got = bucket_of(assign(KeyView(limit, remaining=10, nodes=3.0), T0))
    assert (got.tokens_per_fill, got.fill_interval_s) == (33, 100)
    assert abs(got.tokens_per_fill / got.fill_interval_s - 10 / 10 / 3) < 0.01
    assert got.max_tokens == 4  # 10 / 3 rounded up


def test_envoy_140_constraints_hold_for_any_numbers() -> None:
    """fill_interval whole seconds >= 1 (less is unlimited in 1.40), tokens_per_fill >= 1 (none
    never refills), max_tokens >= 1 (the proto requires it), a TTL (unset expires at once)."""
    for algorithm in AlgorithmName:
        for rpu in (1, 3, 7, 100, 10_000):
            for unit in (Unit.SECOND, Unit.MINUTE, Unit.DAY):
                limit = RateLimit(rpu, unit, algorithm=algorithm)
                for nodes in (1.0, 2.5, 40.0, 1000.0):
                    for remaining in (1, rpu // 2 + 1, rpu):
                        got = assign(KeyView(limit, remaining, nodes=nodes, reset_ms=500), T0)
                        b = bucket_of(got)
                        assert b.fill_interval_s >= 1 and b.tokens_per_fill >= 1
                        assert 1 <= b.max_tokens <= rpu
                        assert got.ttl_s >= 1


def test_the_burst_is_capped_by_the_capacity_share_of_a_token_bucket() -> None:
    limit = RateLimit(10, Unit.SECOND, algorithm=AlgorithmName.TOKEN_BUCKET, burst=40)
    assert bucket_of(assign(KeyView(limit, remaining=40, nodes=4.0), T0)).max_tokens == 10
    assert bucket_of(assign(KeyView(limit, remaining=2, nodes=4.0), T0)).max_tokens == 1


def test_a_blocked_counter_denies_until_the_block_ends_then_is_rechecked() -> None:
    got = assign(KeyView(MINUTE_100, remaining=0, blocked_ms=12_300), T0)
    assert got.action is Action.DENY_ALL
    assert got.recheck_ms == T0 + 12_300
    assert got.ttl_s == 14  # 13 s rounded up, and a second for the recheck's answer to arrive


def test_an_estimate_at_zero_denies_until_it_can_change() -> None:
    got = assign(KeyView(MINUTE_100, remaining=0, nodes=3.0), T0)
    assert got.action is Action.DENY_ALL
    assert got.recheck_ms == T0 + POLICY.report_interval_ms  # nothing known: the next report
    synced = assign(KeyView(MINUTE_100, remaining=0, reset_ms=30_000, sync_ms=1500), T0)
    assert synced.recheck_ms == T0 + 1750


def test_shadow_rules_allow_and_deny_lists_deny() -> None:
    assert assign(KeyView(MINUTE_100, 0, blocked_ms=5000, shadow=True), T0).action is (
        Action.ALLOW_ALL
    )
    deny = assign(KeyView(RateLimit(0, Unit.SECOND), 0), T0)
    assert (deny.action, deny.recheck_ms, deny.ttl_s) == (Action.DENY_ALL, 0, POLICY.ttl_s)


def test_a_new_bucket_is_sent_only_when_it_differs_from_what_envoys_bucket_holds() -> None:
    """Envoy builds a bucket full at each change: what matters is what the gateway's bucket
    still holds (built at 40, minus what it spent), against what it would get now."""
    first = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0, reset_ms=60_000), T0)
    assert settle(None, first, T0) == first
    later = T0 + 5000

    def now(remaining: int, nodes: float = 2.0) -> Assignment:
        return assign(KeyView(MINUTE_100, remaining, nodes=nodes, reset_ms=55_000), later)

    def anew(remaining: int, nodes: float = 2.0) -> Assignment:
        return replace(now(remaining, nodes), replaces_bucket=True)

    assert settle(first, now(70), later, spent=5) is None  # spent its share: holds 35, gets 35
    assert settle(first, now(40), later, spent=5) == anew(40)  # others spent: holds 35, gets 20
    assert settle(first, now(76), later, spent=30) == anew(76)  # others did not: 10 -> 38
    assert settle(first, now(80, nodes=3.0), later) == anew(80, nodes=3.0)  # 40 -> 27


def test_tiny_buckets_do_not_flap_between_neighbouring_numbers() -> None:
    limit = RateLimit(6, Unit.SECOND, 10)
    three = assign(KeyView(limit, remaining=6, nodes=2.0), T0)
    two = assign(KeyView(limit, remaining=3, nodes=2.0), T0 + 5000)
    assert (bucket_of(three).max_tokens, bucket_of(two).max_tokens) == (3, 2)
    assert settle(three, two, T0 + 5000) is None  # 3 held, 2 now: one token apart


def test_a_token_bucket_rate_change_is_sent() -> None:
    limit = RateLimit(100, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET)
    first = assign(KeyView(limit, remaining=100, nodes=2.0), T0)
    more_nodes = assign(KeyView(limit, remaining=100, nodes=3.0), T0 + 5000)
    got = settle(first, more_nodes, T0 + 5000, spent=17)
    assert got == replace(more_nodes, replaces_bucket=True)  # 50 -> 33 a minute


def test_a_trailing_windows_smaller_bucket_keeps_what_envoys_bucket_spent() -> None:
    """A trailing window's smaller bucket goes without a blanket rule before it, so Envoy keeps
    the fraction its bucket holds: one that a burst drained since its report stays drained
    (built full, it took a new share of a count that lacked the burst). What the server counts
    it holds scales the same way; a larger one is built full, as a fixed window's smaller one."""
    first = assign(KeyView(SLIDING_100, remaining=80, nodes=2.0, reset_ms=1000), T0)
    later = T0 + 5000
    smaller = assign(KeyView(SLIDING_100, remaining=40, nodes=2.0, reset_ms=1000), later)
    got = settle(first, smaller, later, spent=10, trailing=True)  # 30 of 40 held: 3/4 of 20
    assert got is not None and not got.replaces_bucket and bucket_of(got).max_tokens == 20
    assert got.built_tokens == pytest.approx(15, abs=0.1)  # a token a minute refilled
    assert got.held(later, 0) == got.built_tokens and got.held(later, 16) == 0.0
    assert settle(first, smaller, later, spent=10) == replace(smaller, replaces_bucket=True)
    larger = assign(KeyView(SLIDING_100, remaining=80, nodes=2.0, reset_ms=1000), later + 5000)
    grown = settle(got, larger, later + 5000, spent=5, trailing=True)  # 10 of 20 held: 40
    assert grown == replace(larger, replaces_bucket=True) and grown.built_tokens is None


def test_held_tokens_is_an_upper_bound_of_envoys_bucket() -> None:
    bucket = TokenBucket(max_tokens=10, tokens_per_fill=6, fill_interval_s=60)
    assert held_tokens(bucket, 0.0, 0) == 10
    assert held_tokens(bucket, 10.0, 8) == 3  # 10 - 8 + 1 refilled
    assert held_tokens(bucket, 10.0, 20) == 0
    assert held_tokens(bucket, 600.0, 8) == 10  # never above max_tokens


def test_an_unchanged_assignment_is_sent_again_before_it_expires_keeping_its_bucket() -> None:
    first = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0), T0)
    late = first.expires_ms - POLICY.refresh_before_ms
    assert settle(first, first, late - 1) is None
    again = settle(first, replace(first, issued_ms=late), late)
    assert again is not None and again.bucket == first.bucket and again.issued_ms == late
    assert again.since_ms == T0  # Envoy keeps the bucket it built then


def test_kept_moves_the_recheck_so_a_passed_one_does_not_run_again() -> None:
    first = assign(KeyView(MINUTE_100, remaining=80, reset_ms=1000), T0)
    fresh = assign(KeyView(MINUTE_100, remaining=80, reset_ms=60_000), T0 + 1000)
    assert settle(first, fresh, T0 + 1000) is None
    assert kept(first, fresh).recheck_ms == T0 + 61_000


def test_a_change_of_action_is_always_sent() -> None:
    bucket = assign(KeyView(MINUTE_100, remaining=80), T0)
    deny = assign(KeyView(MINUTE_100, remaining=0, blocked_ms=60_000), T0 + 5000)
    assert settle(bucket, deny, T0 + 5000) == deny
    back = assign(KeyView(MINUTE_100, remaining=100), T0 + 65_000)
    assert settle(deny, back, T0 + 65_000) == back


def test_a_longer_block_is_sent_a_same_one_is_not() -> None:
    deny = assign(KeyView(MINUTE_100, 0, blocked_ms=10_000), T0)
    same = assign(KeyView(MINUTE_100, 0, blocked_ms=5_000), T0 + 5000)
    assert settle(deny, same, T0 + 5000) is None
    longer = assign(KeyView(MINUTE_100, 0, blocked_ms=60_000), T0 + 5000)
    assert settle(deny, longer, T0 + 5000) == longer


def test_several_limits_combine_to_the_strictest() -> None:
    per_second = RateLimit(10, Unit.SECOND)  # 10 tokens a second
    per_day = RateLimit(1000, Unit.DAY)  # about 0.012 a second
    fast, slow = (assign(KeyView(limit, remaining=10), T0) for limit in (per_second, per_day))
    got = bucket_of(combine([fast, slow]))
    assert (got.fill_interval_s, got.max_tokens) == (86_400, 10)
    deny = assign(KeyView(per_day, 0, blocked_ms=3000), T0)
    assert combine([fast, deny]) == deny


def test_abandoned_after_the_policys_idle_reports() -> None:
    assert not abandoned(POLICY.abandon_after_reports - 1)
    assert abandoned(POLICY.abandon_after_reports)


# -- a report through the limiter --------------------------------------------------------------


def test_a_report_counts_into_the_same_counter_as_should_rate_limit() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100, unit=Unit.MINUTE)
    limiter.hit(T0, [hit(r, hits=5)])  # a ShouldRateLimit request
    got = report_usage(limiter, hit(r, hits=30), T0 + 10)
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.pending == 35
    assert bucket_of(got).max_tokens == 65


def test_reported_hits_are_counted_even_over_the_limit_and_reach_the_store() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), rule(rpu=10, unit=Unit.MINUTE, spans=6)
    report_usage(limiter, hit(r, hits=25), T0)  # Envoy admitted them: they count
    batch = limiter.end_span(T0 + 10_000)
    assert [push.hits for push in batch.pushes] == [25]
    limiter.apply_sync(T0 + 10_000, batch, store.execute(batch))
    got = report_usage(limiter, hit(r, hits=0), T0 + 10_001)
    assert got.action is Action.DENY_ALL  # the store's total is over: blocked
    assert got.recheck_ms > T0 + 10_001


def test_unmatched_and_unlimited_buckets_are_allowed() -> None:
    limiter = LocalLimiter()
    assert report_usage(limiter, hit(None, hits=3), T0).action is Action.ALLOW_ALL
    unlimited = Rule("d", (("k", ""),), None, unlimited=True)
    assert report_usage(limiter, hit(unlimited, hits=3), T0).action is Action.ALLOW_ALL
    assert len(limiter.keys) == 0


def test_a_shadow_rule_counts_but_allows() -> None:
    limiter, r = LocalLimiter(), rule(rpu=2, shadow=True)
    assert report_usage(limiter, hit(r, hits=9), T0).action is Action.ALLOW_ALL
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.pending == 9


def test_a_rule_with_several_limits_counts_each_and_takes_the_strictest() -> None:
    limits = (RateLimit(100, Unit.SECOND), RateLimit(20, Unit.MINUTE))
    r = Rule("d", (("k", ""),), limits=limits)
    limiter = LocalLimiter()
    got = report_usage(limiter, hit(r, hits=8), T0)
    assert bucket_of(got).max_tokens == 12  # the minute's 20 - 8
    assert len(limiter.keys) == 2


def test_a_bucket_quota_tracks_what_envoys_bucket_spent_since_it_was_built() -> None:
    limiter, r = LocalLimiter(), rule(rpu=100, unit=Unit.MINUTE)
    quota = BucketQuota()
    first = quota.report(limiter, hit(r, hits=1), T0)  # the first request, before any bucket
    assert first is not None and bucket_of(first).max_tokens == 99 and quota.spent == 0
    assert quota.report(limiter, hit(r, hits=20), T0 + 5000) is None  # its own share: no news
    assert quota.spent == 20
    limiter.hit(T0 + 6000, [hit(r, hits=40)])  # ShouldRateLimit traffic on the same counter
    again = quota.report(limiter, hit(r, hits=0), T0 + 10_000)
    assert again is not None and bucket_of(again).max_tokens == 39 and quota.spent == 0
    assert quota.recheck_ms == T0 + 30_250  # the counter's next sync (span end), and a margin


def test_a_trailing_windows_bucket_keeps_its_reports_share_until_the_next_report() -> None:
    """The nodes estimate moves at every sync; between reports a trailing window's bucket keeps
    the share its last report set. Raised at a recheck, it rebuilt full a bucket that a burst
    had drained unreported (simulator, boundary bursts at twice MAX on 8 gateways: 273 of 240
    in a trailing window, 241 so); the next report, which tells what it spent, takes it."""
    r, limiter, quota = Rule("d", (("k", ""),), SLIDING_100), LocalLimiter(), BucketQuota()
    assert quota.report(limiter, hit(r, hits=1), T0) is not None
    state = limiter.keys.get(hit(r).key)
    assert state is not None
    state.nodes.value = 4.0
    quarter = quota.report(limiter, hit(r, hits=4), T0 + 5000)
    assert quarter is not None and bucket_of(quarter).max_tokens == 24
    state.nodes.value = 2.0  # a sync: this node carries half the fleet's traffic
    assert quota.recheck(limiter, hit(r, hits=0), T0 + 6000) is None
    half = quota.report(limiter, hit(r, hits=0), T0 + 10_000)
    assert half is not None and bucket_of(half).max_tokens == 48


def test_a_new_fixed_window_always_starts_a_new_bucket() -> None:
    """The gateway's bucket may still hold tokens of the window that ended: they are gone."""
    first = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0, window=7), T0)
    same_numbers = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0, window=8), T0 + 60_000)
    got = settle(first, same_numbers, T0 + 60_000)
    assert got is not None and got.windows == (8,) and got.bucket == first.bucket
    assert got.replaces_bucket  # Envoy must build it anew, full (see Assignment)


def test_only_a_new_bucket_replacing_one_is_marked_so() -> None:
    first = assign(KeyView(MINUTE_100, remaining=80, nodes=2.0), T0)
    assert not first.replaces_bucket
    late = first.expires_ms - POLICY.refresh_before_ms
    renewed = settle(first, first, late)
    assert renewed is not None and not renewed.replaces_bucket  # the same bucket, kept
    deny = assign(KeyView(MINUTE_100, 0, blocked_ms=5000), T0)
    back = settle(deny, first, T0 + 5000)
    assert back is not None and not back.replaces_bucket  # after a blanket rule: built full


def test_hits_reported_after_a_window_began_count_pro_rata_in_the_one_before() -> None:
    """10 hits admitted over the 5 s before a report that comes 2 s into a new window: 6 of
    them were the previous window's and are pushed there, 4 count against the new one."""
    limiter, r = FleetLimiter(), rule(rpu=100, unit=Unit.SECOND, multiplier=10, spans=5)
    # Tracked in the window before.
    limiter.count_admitted(T0 - 3000, hit(r, hits=0), edge_over_ms=MINUTE)
    limiter.count_admitted(T0 + 2000, hit(r, hits=10), since_ms=T0 - 3000, edge_over_ms=MINUTE)
    batch = limiter.end_span(T0 + 2000)
    window = T0 // 10_000
    assert sorted((push.window, push.hits) for push in batch.pushes) == [
        (window - 1, 6),
        (window, 4),
    ]


def test_alone_a_node_drops_the_late_part() -> None:
    limiter, r = LocalLimiter(), rule(rpu=100, unit=Unit.SECOND, multiplier=10, spans=5)
    limiter.count_admitted(T0 + 2000, hit(r, hits=10), since_ms=T0 - 3000, edge_over_ms=MINUTE)
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.pending == 4


def test_global_shadow_mode_counts_and_allows() -> None:
    limiter, r = LocalLimiter(), rule(rpu=2)
    got = report_usage(limiter, hit(r, hits=9), T0, policy=QuotaPolicy(shadow_mode=True))
    assert got.action is Action.ALLOW_ALL
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.pending == 9
