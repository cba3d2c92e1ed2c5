"""RLQS leases (core/quota_lease.py) and their counting through the limiter
(core/quota_usage.py, a fixed window that says `consistency: strict`), on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.core.quota_assign import Action, QuotaPolicy
from ratelimit_sidecar.core.quota_lease import DEFAULT_LEASE, LEASE_FILL_S, Free, Grant, Lease
from ratelimit_sidecar.core.quota_usage import LEASE_MIN_RECHECK_MS, BucketQuota
from ratelimit_sidecar.core.quota_windows import leasable
from ratelimit_sidecar.core.types import Push, SyncBatch
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
POLICY = QuotaPolicy()


def free(left: int, *, limit: int = 240, reset_ms: int = 10_000, live: int = 4) -> Free:
    return Free(limit, left, reset_ms, 1000, live)


def paced(rate_per_s: float, upper: float = 0.0) -> Lease:
    """A lease whose last report (at T0) measured this pace, its bucket holding `upper`."""
    lease = Lease()
    lease.roll(0)
    lease.report(0, T0, rate_per_s / 1000)
    lease.upper = lease.likely = upper
    return lease


def sync(limiter: FleetLimiter, store: MemoryStorage, now_ms: int) -> None:
    """A span end of this node against the store."""
    batch = limiter.end_span(now_ms)
    limiter.apply_sync(now_ms, batch, store.execute(batch))


def fixed_rule(rpu: int = 240, *, strict: bool = True, edge: bool = False) -> Rule:
    """240 per 10 s, `consistency: strict` (leased), `edge` (leased after a window near MAX)
    or `eventual` (never)."""
    limit = RateLimit(rpu, Unit.SECOND, 10, spans=5, strict=strict, edge=edge and not strict)
    return Rule("d", (("k", ""),), limit)


def test_leases_granted_at_one_instant_add_up_to_at_most_what_is_free() -> None:
    """Every node sees the same free count at a window's start: each takes at most its
    gateway's part, so no interleaving of the grants passes MAX."""
    grants = [paced(60.0).decide(free(240), T0).tokens for _ in range(4)]
    assert grants == [60, 60, 60, 60]
    late = paced(60.0, upper=0.0)
    late.used = 60  # it spent its fair share: only an even part of what is still free
    assert late.decide(free(40), T0).tokens == 10


def test_a_lease_covers_the_pace_and_more_far_from_max() -> None:
    near = paced(5.0)
    assert near.decide(free(20, reset_ms=8000), T0).tokens == 20  # under its fair share of 60
    near.used = 60
    assert near.decide(free(20, reset_ms=8000), T0).tokens == 5  # past it: an even part
    far = paced(1.0).decide(free(240, reset_ms=12_000), T0)
    assert far.tokens == 12  # two horizons (6 s) of its 1/s


def test_near_the_reset_a_lease_covers_the_pace_until_then() -> None:
    """Within two reports of the reset no report comes in time to top a bucket up better: its
    pace until the reset, a fifth more far from MAX."""
    assert paced(1.0).decide(free(240, reset_ms=9000), T0).tokens == 10  # 9 x 1.2
    assert paced(10.0).decide(free(200, reset_ms=9000), T0).tokens == 60  # 90: its fair share
    assert paced(5.0).decide(free(150, reset_ms=9000), T0).tokens == 45  # 180 > 150: not far


def test_far_from_max_counts_what_the_other_gateways_leases_hold_for_their_pace() -> None:
    """What is free lacks the other gateways' leases, counted but not spent: their pace spends
    them within the fleet's need, so they are not a shortfall."""
    lease = paced(5.0)
    assert lease.decide(free(150, reset_ms=9000), T0).tokens == 45  # 180 > 150: not far
    lease.leased = 45  # its last lease: three more like it, counted, cover their pace
    assert lease.decide(free(150, reset_ms=9000), T0).tokens == 54  # 150 + 135 >= 180: far
    lease.leased = 5  # small leases outstanding leave the fleet short
    assert lease.decide(free(150, reset_ms=9000), T0).tokens == 45


def test_the_fleets_need_follows_the_nodes_estimate() -> None:
    """A node carrying 60 % of the traffic stands for 1.6 nodes, not the 4 live ones."""

    def lease_of(nodes: float) -> int | None:
        return paced(10.0).decide(replace(free(150, reset_ms=6000), nodes=nodes), T0).tokens

    assert lease_of(1.6) == 72  # the fleet needs 10 x 1.6 x 6 = 96 of 150: far, 60 x 1.2
    assert lease_of(0.0) == 60  # unknown: 4 x 60 = 240 > 150, its pace until the reset


def test_a_lease_in_a_long_window_covers_part_of_its_pace_until_the_reset_from_the_spare() -> None:
    def minute(left: int) -> Free:
        return free(left, limit=1440, reset_ms=60_000)

    # two horizons (12) and its 1/s for the 48 s past them: the fleet's pace leaves 1,200 spare
    assert paced(1.0).decide(minute(1440), T0).tokens == 60
    # at 5/s the fleet's pace leaves 240 spare: an even part of it, 60, on top of 2 x 30
    assert paced(5.0).decide(minute(1440), T0).tokens == 120
    # the fleet's pace needs more than is free: one horizon, nothing spare
    assert paced(1.0).decide(minute(200), T0).tokens == 6
    # a window no longer than the horizons: as before
    assert paced(1.0).decide(free(240, reset_ms=12_000), T0).tokens == 12


def test_a_long_window_with_room_tops_a_bucket_up_before_it_runs_low() -> None:
    """A top-up leaves the old bucket's tokens counted until the next report: far from MAX that
    is cheap, and a burst then finds the bucket nearly full, not half spent."""

    def minute(left: int, reset_ms: int = 60_000) -> Free:
        return free(left, limit=1440, reset_ms=reset_ms)

    assert paced(1.0, upper=40.0).decide(minute(1440), T0).tokens == 60  # 40 < 0.7 x 60
    # the headroom, 400 - 240 = 160, under 3 x 4 gateways x 40 held: kept until low
    assert paced(1.0, upper=40.0).decide(minute(400), T0).tokens is None
    # near the reset: kept (40 held over a quarter of 90), though 108 would be leased
    assert paced(10.0, upper=40.0).decide(minute(1440, reset_ms=9000), T0).tokens is None


def test_a_bucket_holding_enough_is_kept_and_rechecked_when_it_will_run_low() -> None:
    lease = paced(10.0, upper=40.0)
    got = lease.decide(free(200, reset_ms=20_000), T0 + 1000)  # 30 held, over 60 / 4 needed
    assert got.tokens is None
    assert got.recheck_ms == T0 + 1000 + 1500  # (30 - 15) tokens at 10/s


def test_with_little_free_a_bucket_is_kept_until_it_likely_ran_dry() -> None:
    """Under a quarter of its need left, a bucket is topped up early while the window has room;
    with little free (under half of every gateway's need), replacing it would leave its tokens
    counted until the next report, which the window cannot spare."""
    plenty = paced(10.0, upper=10.0).decide(free(200), T0)
    assert plenty.tokens == 50  # 10 left of 60 needed: a new lease
    scarce = paced(10.0, upper=10.0).decide(free(100), T0)  # 100 < 0.5 x 60 x 4 gateways
    assert (scarce.tokens, scarce.recheck_ms) == (None, T0 + 1000)  # dry in a second


def test_nothing_free_denies_until_the_next_sync() -> None:
    got = paced(10.0).decide(free(0), T0)
    assert (got.tokens, got.recheck_ms) == (0, T0 + 1000)


def test_nothing_free_keeps_a_bucket_that_may_still_hold_tokens() -> None:
    """Its pace says it ran dry, its report has not said so: a DENY_ALL would free none of its
    tokens (counted until the report) and only take them from the gateway."""
    lease = paced(10.0, upper=20.0)
    got = lease.decide(free(0), T0 + 3000)  # 30 tokens' worth of pace since: likely dry
    assert (got.tokens, got.recheck_ms) == (None, T0 + 4000)
    lease.report(20, T0 + 5000, 10.0 / 1000)  # it was: now empty, denied
    assert lease.decide(free(0), T0 + 5000).tokens == 0


def test_a_replaced_bucket_stays_counted_until_the_report_tells_what_it_spent() -> None:
    lease = paced(10.0)
    lease.build(30, T0)
    assert lease.target() == 30
    lease.build(20, T0 + 2000)  # its 30 may have been spent meanwhile: both counted
    assert lease.target() == 50
    lease.report(25, T0 + 5000, 0.01)  # 25 spent, all of them maybe from the first bucket
    assert (lease.used, lease.upper, lease.allowance) == (25, 20.0, 0.0)
    assert lease.target() == 45  # the first bucket's 5 unspent go back


def test_a_report_after_a_new_lease_decides_on_what_the_new_bucket_likely_holds() -> None:
    """The report cannot say which bucket spent its usage: counted, the old one first (the most
    the new one can hold); decided, the old one at the pace until it was replaced."""
    lease = paced(10.0)
    lease.build(30, T0)
    lease.build(20, T0 + 2000)  # the first bucket likely spent 20 by then
    lease.report(28, T0 + 5000, 0.01)
    assert (lease.upper, lease.target()) == (20.0, 48)  # at most 20 left: counted
    assert lease.held(T0 + 5000) == 12.0  # likely 20 - (28 - 20)
    got = lease.decide(free(200, reset_ms=20_000), T0 + 5000)
    assert got.tokens == 50  # 12, under a quarter of 60: topped up (on `upper` it was kept)


def test_a_node_carrying_clearly_more_than_an_even_part_takes_its_part_of_what_is_free() -> None:
    def third_of_free(nodes: float) -> int | None:
        lease = paced(20.0)
        lease.used = 100  # past its fair share of MAX: only a part of what is free
        return lease.decide(replace(free(90, live=3), nodes=nodes), T0).tokens

    assert third_of_free(1.6) == 56  # 90 / 1.6: it carries 60 % of the traffic
    assert third_of_free(2.5) == 30  # a little over an even part: an even part, 90 / 3
    assert third_of_free(0.0) == 30  # no estimate yet


def test_a_new_window_abandons_the_bucket_counting_what_it_may_have_spent_in_it() -> None:
    lease = paced(10.0)
    lease.build(50, T0)
    assert lease.roll(1)  # a bucket of the window before: abandoned
    lease.abandon(100)  # 100 ms into the window: at twice its pace, 2 tokens at most
    # Those 2 (no report will tell) and the request that makes the bucket anew.
    assert (lease.used, lease.upper, lease.target()) == (2, 1.0, 3)
    lease.report(1, T0 + 10_150, 0.01)  # that request, reported alone
    assert (lease.used, lease.upper, lease.target()) == (3, 0.0, 3)
    assert not Lease().roll(1)  # nothing held yet: nothing to abandon


def test_a_leased_counter_counts_its_lease_and_pushes_it_at_once() -> None:
    limiter, store, r = FleetLimiter(), MemoryStorage(), fixed_rule()
    limiter.live_nodes = 4
    quota = BucketQuota()
    first = quota.report(limiter, hit(r, hits=1), T0 + 10)
    assert first is not None and first.action is Action.TOKEN_BUCKET and first.bucket
    # The window's total never read (nor the live nodes, in a node just started): one token,
    # decided again once the push has answered.
    assert (first.bucket.max_tokens, first.bucket.fill_interval_s) == (1, LEASE_FILL_S)
    assert first.recheck_ms == T0 + 10 + LEASE_MIN_RECHECK_MS
    state = limiter.keys.get(hit(r).key)
    assert state is not None and state.pending == 1 + 1  # the lease, and the first request
    assert state.next_sync == T0 + 10  # pushed at once
    store.execute(SyncBatch(T0, [Push(hit(r).key, state.window, 180, state.limit)]))  # others
    sync(limiter, store, T0 + 10)
    again = quota.recheck(limiter, hit(r, hits=0), T0 + 110)
    assert again is not None and again.bucket is not None and again.replaces_bucket
    # No pace yet: up to its fair share, within what is free (240 - 180 - its own 2).
    assert again.bucket.max_tokens == 58
    assert state.pending == 58  # 58 more: the replaced bucket's 1 stays counted until a report


def _leased_window(now_ms: int, unit: Unit = Unit.SECOND) -> tuple[FleetLimiter, BucketQuota, Rule]:
    """A gateway's bucket leased at `now_ms` after two reports 2 s apart (25/s)."""
    tens = 10 if unit is Unit.SECOND else 1
    r = Rule("d", (("k", ""),), RateLimit(240, unit, tens, spans=5, strict=True))
    limiter, quota = FleetLimiter(), BucketQuota()
    limiter.live_nodes = 4
    quota.report(limiter, hit(r, hits=1), now_ms - 2000)
    lease = quota.report(limiter, hit(r, hits=50), now_ms)
    assert lease is not None and lease.action is Action.TOKEN_BUCKET
    return limiter, quota, r


def test_a_window_end_abandons_the_bucket_and_its_gateway_makes_it_anew() -> None:
    """Envoy drops an abandoned bucket with its unreported usage and reports the request that
    makes it anew at once: its reports then count only the new window's requests."""
    limiter, quota, r = _leased_window(T0 + 13_000)
    pace = quota.lease.rate
    gone = quota.recheck(limiter, hit(r, hits=0), T0 + 20_000)  # the window's reset
    assert gone is not None and gone.action is Action.ABANDON and quota.abandoned
    assert quota.lease.target() == 1  # the request that makes it anew, admitted by Envoy
    assert gone.recheck_ms == T0 + 20_000 + POLICY.forget_ms
    assert quota.recheck(limiter, hit(r, hits=0), T0 + 20_500) is None  # nothing to assign
    anew = quota.report(limiter, hit(r, hits=1), T0 + 20_010)
    assert anew is not None and anew.bucket is not None and not anew.replaces_bucket
    assert quota.lease.rate == pytest.approx(pace)  # one request is not a pace
    assert not quota.abandoned


def test_a_bucket_made_anew_windows_after_its_abandon_is_not_abandoned_again() -> None:
    limiter, quota, r = _leased_window(T0 + 13_000)
    quota.recheck(limiter, hit(r, hits=0), T0 + 20_000)  # abandoned; its gateway quiet since
    anew = quota.report(limiter, hit(r, hits=1), T0 + 45_000)  # two windows later
    assert anew is not None and anew.action is Action.TOKEN_BUCKET
    assert quota.lease.used == 1  # that request, in its own window


def test_an_idle_bucket_of_an_unleased_counter_is_forgotten() -> None:
    quota, r = BucketQuota(), fixed_rule(strict=False)  # eventual
    limiter = FleetLimiter()
    quota.report(limiter, hit(r, hits=1), T0)
    answers = [
        quota.report(limiter, hit(r, hits=0), T0 + n * 5000)
        for n in range(1, QuotaPolicy().abandon_after_reports + 1)
    ]
    assert answers[-1] is not None and answers[-1].action is Action.ABANDON
    assert quota.forgotten
    assert all(a is None or a.action is not Action.ABANDON for a in answers[:-1])


def test_an_idle_bucket_under_a_block_or_a_deny_list_is_kept() -> None:
    """Abandoned, its next request would pass by Envoy's no-assignment fallback: kept until its
    block ends, a deny list's for as long as its stream has room (`keep_denied`)."""

    def idle_after(
        rule: Rule, hits: list[int], keep_denied: bool = True
    ) -> tuple[BucketQuota, list[Action | None]]:
        quota, limiter = BucketQuota(QuotaPolicy()), FleetLimiter()
        answers = [
            quota.report(limiter, hit(rule, hits=n), T0 + i * 5000, keep_denied=keep_denied)
            for i, n in enumerate(hits)
        ]
        return quota, [None if a is None else a.action for a in answers]

    idle = [0] * 2 * QuotaPolicy().abandon_after_reports
    blocked, actions = idle_after(Rule("d", (("k", ""),), RateLimit(2, Unit.DAY)), [1, 5, *idle])
    assert actions[1] is Action.DENY_ALL and Action.ABANDON not in actions
    assert not blocked.abandoned
    deny_list = Rule("d", (("k", ""),), RateLimit(0, Unit.DAY))
    denied, actions = idle_after(deny_list, [1, *idle])
    assert actions[0] is Action.DENY_ALL and Action.ABANDON not in actions
    assert denied.denies_for_good and not denied.abandoned
    # refreshed before Envoy's TTL (30 s) runs out: 2 minutes of idle reports, resent each 20 s
    assert actions.count(Action.DENY_ALL) >= len(idle) * 5 // 30
    dropped, actions = idle_after(deny_list, [1, *idle], keep_denied=False)
    assert Action.ABANDON in actions and dropped.forgotten


def test_a_report_first_in_a_new_window_counts_there_then_the_bucket_is_abandoned() -> None:
    limiter, quota, r = _leased_window(T0 + 13_000)
    gone = quota.report(limiter, hit(r, hits=30), T0 + 20_300)  # before any recheck
    assert gone is not None and gone.action is Action.ABANDON
    assert quota.lease.target() == 30 + 1  # all of it here: its split is unknown


def test_a_window_longer_than_a_minute_is_not_leased() -> None:
    """It outlives a quiet gateway's bucket (Envoy forgets it after a minute of empty reports)
    with its lease counted: the plain assignments serve it, its counter at the edge."""
    minute, hour = (
        Rule("d", (("k", ""),), RateLimit(240, u, strict=True)) for u in (Unit.MINUTE, Unit.HOUR)
    )
    assert leasable(minute, POLICY) and not leasable(hour, POLICY)
    quota, limiter = BucketQuota(), FleetLimiter()
    first = quota.report(limiter, hit(hour, hits=1), T0)
    assert first is not None and first.action is Action.TOKEN_BUCKET
    quota.report(limiter, hit(hour, hits=50), T0 + 5000)
    assert quota.lease.built_ms < 0  # never leased
    state = limiter.keys.get(hit(hour).key)
    assert state is not None and state.edge  # strict asks no less than the edge


def test_beyond_reach_of_the_reset_a_lease_is_sized_for_a_rise_in_pace_whole() -> None:
    """A burst that began after a report: the next report's pace counts whole for the horizon
    (blended, the bucket ran dry again before the report after); within reach of the reset the
    blend stays (the pace until the reset is all the lease)."""
    for reset_ms, horizon in ((40_000, 6000), (8000, 8000)):
        lease = paced(2.0, upper=200.0)  # far from dry at the report: the pace is blended
        lease.report(50, T0 + 5000, 10.0 / 1000)  # 10 a second now, blended to 4.4
        assert lease.latest * 1000 == 10.0 and round(lease.rate * 1000, 6) == 4.4
        window = free(1000, limit=1440, reset_ms=reset_ms)
        need, _ = lease._need(window, DEFAULT_LEASE)
        assert round(need) == round(4.4 * horizon / 1000)  # when to top up: blended
        pace = 10.0 if reset_ms > DEFAULT_LEASE.reach_ms else 4.4
        assert round(lease._risen(need, window, DEFAULT_LEASE)) == round(pace * horizon / 1000)


def test_a_gateways_pace_is_blended_over_its_reports() -> None:
    """A quiet report (5 s of a Poisson stream may count nothing) does not make a busy bucket
    look full: the pace keeps 70 % of the one before (PACE_WEIGHT 0.3)."""
    lease = paced(10.0, upper=200.0)  # the first report sets the pace as it is
    assert lease.rate * 1000 == 10.0
    lease.report(0, T0 + 5000, 0.0)
    assert round(lease.rate * 1000, 6) == 7.0
    lease.report(100, T0 + 10_000, 0.02)
    assert round(lease.rate * 1000, 6) == round(0.3 * 20 + 0.7 * 7, 6)
    # So its bucket is topped up as the blended pace runs it low, not kept until the reset.
    lease.upper = lease.likely = 5.0
    got = lease.decide(free(200, reset_ms=20_000), T0 + 10_000)
    assert got.tokens is not None and got.tokens > 5


def test_a_report_that_leaves_the_bucket_dry_takes_a_rise_in_pace_whole() -> None:
    """It ran out because it got busier: a top-up by the blended pace would run dry again."""
    dry, left = paced(1.0), paced(1.0)
    dry.build(10, T0)
    left.build(30, T0)
    dry.report(10, T0 + 5000, 4.0 / 1000)  # all 10 spent, 20 offered
    left.report(10, T0 + 5000, 4.0 / 1000)  # 20 still held: blended
    assert dry.rate * 1000 == pytest.approx(4.0)
    assert left.rate * 1000 == pytest.approx(0.3 * 4.0 + 0.7 * 1.0)


def test_a_gateway_quiet_for_days_keeps_a_pace_that_decides() -> None:
    """Blended over 3,000 quiet reports (four hours), the pace nears 0 without reaching it: a
    bucket's dry time then lies past the reset (dividing by that pace overflowed)."""
    lease = paced(10.0, upper=5.0)
    for report in range(1, 3000):
        lease.report(0, T0 + report * 5000, 0.0)
    assert 0.0 < lease.rate < 1e-300
    got = lease.decide(free(200, reset_ms=86_400_000), T0 + 3000 * 5000)
    assert got == Grant(None, T0 + 3000 * 5000 + 86_400_000)


def test_a_gateway_denied_in_a_full_window_holds_its_deny_until_the_reset() -> None:
    """A gateway that spent its lease in a full window, then reports no traffic (a pace of 0),
    holds a DENY_ALL (or its spent bucket) at every moment: one left to lapse lets Envoy apply
    its fallback (ALLOW_ALL in the documented setup). Before: renewed with its 2 s TTL and
    decided again only at the reset, so 3 s of every 5 s admitted everything (simulator, a
    daily window of 2,000 at 2x: 3,118 admitted)."""
    limiter, store = FleetLimiter(), MemoryStorage()
    r = Rule("d", (("k", ""),), RateLimit(240, Unit.MINUTE, spans=5, strict=True))
    limiter.live_nodes, quota, key = 4, BucketQuota(), hit(r).key
    quota.report(limiter, hit(r, hits=1), T0 + 10)
    state = limiter.keys.get(key)
    assert state is not None
    store.execute(SyncBatch(T0, [Push(key, state.window, 180, state.limit)]))  # the others
    sync(limiter, store, T0 + 10)
    lease = quota.recheck(limiter, hit(r, hits=0), T0 + 110)
    assert lease is not None and lease.bucket is not None and lease.bucket.max_tokens == 58
    store.execute(SyncBatch(T0, [Push(key, state.window, 1, state.limit)]))  # the last one
    sync(limiter, store, T0 + 1000)
    live_until, spent = lease.expires_ms, 58
    for now in range(T0 + 5000, T0 + 59_000, 100):
        if (now - T0) % 5000 == 0:  # Envoy's report: what it admitted, then nothing
            sent = quota.report(limiter, hit(r, hits=spent), now)
            spent = 0
        elif quota.recheck_ms and quota.recheck_ms <= now:
            sent = quota.recheck(limiter, hit(r, hits=0), now)
        else:
            sent = None
        if sent is not None:  # denied, or the spent bucket kept (it may hold a counted token)
            renewed = sent.bucket == lease.bucket and sent.built_ms > 0
            assert sent.action is Action.DENY_ALL or renewed, now - T0
            live_until = sent.expires_ms
        assert now < live_until, f"no assignment {now - T0} ms into the window"


def test_leases_are_for_one_fixed_window_strict_or_at_the_edge() -> None:
    r, edge, eventual = fixed_rule(), fixed_rule(edge=True), fixed_rule(strict=False)
    assert leasable(r, POLICY) and leasable(edge, POLICY) and not leasable(eventual, POLICY)
    assert not leasable(replace(r, shadow_mode=True), POLICY)
    assert not leasable(r, QuotaPolicy(shadow_mode=True))


def test_an_edge_window_is_leased_after_one_near_max_and_plain_after_a_quiet_one() -> None:
    """`consistency: edge`: each window's choice is made once the counter is in it, so the one
    before closes in its own way (a lease abandoned at its reset, a plain bucket refilled); a
    bucket turning to leases gives up its plain bucket as a lease's at a window's end."""
    limiter, quota, r = FleetLimiter(), BucketQuota(), fixed_rule(strict=False, edge=True)
    first = quota.report(limiter, hit(r, hits=1), T0 + 100)  # nothing known yet: leased
    assert first is not None and first.bucket is not None
    assert first.bucket.fill_interval_s == LEASE_FILL_S
    quota.report(limiter, hit(r, hits=10), T0 + 5000)
    reset = quota.recheck(limiter, hit(r, hits=0), T0 + 10_000)
    assert reset is not None and reset.action is Action.ABANDON  # the lease's window closes
    plain = quota.report(limiter, hit(r, hits=1), T0 + 10_100)  # 23 of 240 before: plain
    assert plain is not None and plain.bucket is not None
    assert plain.bucket.fill_interval_s != LEASE_FILL_S and not quota.windows.leasing
    quota.report(limiter, hit(r, hits=230), T0 + 15_000)  # near MAX
    refill = quota.recheck(limiter, hit(r, hits=0), T0 + 20_000)  # the plain window closes
    assert refill is not None and refill.bucket is not None and not quota.windows.leasing
    taken = quota.report(limiter, hit(r, hits=4), T0 + 20_500)
    assert taken is not None and taken.action is Action.ABANDON and quota.windows.leasing
    lease = quota.report(limiter, hit(r, hits=1), T0 + 20_600)  # the request making it anew
    assert lease is not None and lease.bucket is not None
    assert lease.bucket.fill_interval_s == LEASE_FILL_S
