"""The RLQS rule's use of a gateway's pace (core/quota_assign.py `Pace`, `grow_to`; the
bookkeeping in core/quota_usage.py `BucketQuota`): within a fixed window a bucket grows only by
what is left after the usage no report has brought yet. On a fake clock."""

from __future__ import annotations

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.core.quota_assign import (
    Action,
    Assignment,
    KeyView,
    Pace,
    QuotaPolicy,
    TokenBucket,
    assign,
    deny_until,
)
from ratelimit_sidecar.core.quota_settle import settle
from ratelimit_sidecar.core.quota_usage import BucketQuota
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
MINUTE_240 = RateLimit(240, Unit.MINUTE)
POLICY = QuotaPolicy()
PER_S = 1 / 1000  # one request a second, per ms


def bucket_of(assignment: Assignment) -> TokenBucket:
    assert assignment.action is Action.TOKEN_BUCKET and assignment.bucket is not None
    return assignment.bucket


def test_unreported_usage_is_the_pace_since_the_report_within_the_window_and_the_bucket() -> None:
    pace = Pace(rate_per_ms=2 * PER_S, since_report_ms=4000, held=100.0)
    assert pace.unreported(MINUTE_240, T0 + 30_000) == 8.0  # 2/s for 4 s
    assert pace.unreported(MINUTE_240, T0 + 1000) == 2.0  # only since the window began
    assert Pace(2 * PER_S, 4000, held=5.0).unreported(MINUTE_240, T0 + 30_000) == 5.0
    for algorithm in (AlgorithmName.SLIDING_WINDOW, AlgorithmName.TOKEN_BUCKET):
        limit = RateLimit(240, Unit.MINUTE, algorithm=algorithm)
        assert pace.unreported(limit, T0 + 30_000) == 0.0  # measured: helped a fixed window only


def test_a_fixed_windows_bucket_is_its_share_less_what_it_has_not_reported() -> None:
    view = KeyView(MINUTE_240, remaining=120, nodes=2.0)
    now = T0 + 30_000
    got = assign(view, now, pace=Pace(PER_S, 10_000, held=60.0))
    assert bucket_of(got).max_tokens == 50  # 60, less 10 s at 1/s


def test_it_grows_only_by_what_is_left_after_the_other_gateways_unknown_usage() -> None:
    """Half the fleet's, 4/s for each gateway: the other's last 5 s (a report period) are not
    known yet, 20 requests; only if what is left would not last to the reset at 0.8 x the pace."""
    view = KeyView(MINUTE_240, remaining=100, nodes=2.0)
    now = T0 + 30_000  # 30 s to the reset
    busy = assign(view, now, pace=Pace(4 * PER_S))
    assert (bucket_of(busy).max_tokens, busy.grow_to) == (50, 40)  # 50 - 0.5 x 4/s x 5 s
    quiet = assign(view, now, pace=Pace(2 * PER_S))  # 50 left covers 0.8 x 2/s x 30 s
    assert (bucket_of(quiet).max_tokens, quiet.grow_to) == (50, 50)
    window_start = assign(view, T0 + 1000, pace=Pace(4 * PER_S))  # only 1 s of the window
    assert window_start.grow_to == 48


def test_other_algorithms_grow_to_their_whole_share() -> None:
    for algorithm in (AlgorithmName.SLIDING_WINDOW, AlgorithmName.TOKEN_BUCKET):
        limit = RateLimit(240, Unit.MINUTE, algorithm=algorithm)
        got = assign(KeyView(limit, remaining=100, nodes=2.0), T0 + 30_000, pace=Pace(4 * PER_S))
        assert got.grow_to == bucket_of(got).max_tokens == 50


def test_a_bucket_grows_to_grow_to_and_shrinks_to_its_share() -> None:
    view = KeyView(MINUTE_240, remaining=100, nodes=2.0)
    now = T0 + 30_000
    first = assign(KeyView(MINUTE_240, remaining=240, nodes=2.0), T0)
    drained = settle(first, assign(view, now, pace=Pace(4 * PER_S)), now, spent=110)
    assert drained is not None and drained.replaces_bucket
    assert bucket_of(drained).max_tokens == 40  # holds 10, grows to 40, not 50
    full = settle(first, assign(view, now, pace=Pace(4 * PER_S)), now, spent=0)
    assert full is not None and bucket_of(full).max_tokens == 50  # holds 120: shrinks to 50


def test_a_growth_that_grow_to_takes_back_is_not_sent() -> None:
    view = KeyView(MINUTE_240, remaining=100, nodes=2.0)
    now = T0 + 15_000  # the first assignment is not due for renewal yet
    first = assign(KeyView(MINUTE_240, remaining=240, nodes=2.0), T0)
    fresh = assign(view, now, pace=Pace(4 * PER_S))  # 50, grows to 40
    assert settle(first, fresh, now, spent=82) is None  # holds 38: 40 is no news


def test_a_bucket_after_a_deny_all_grows_the_same_way_a_first_one_does_not() -> None:
    now = T0 + 30_000
    fresh = assign(KeyView(MINUTE_240, remaining=100, nodes=2.0), now, pace=Pace(4 * PER_S))
    after_deny = settle(deny_until(now - 1000, 1000), fresh, now)
    assert after_deny is not None and bucket_of(after_deny).max_tokens == 40
    first = settle(None, fresh, now)
    assert first is not None and bucket_of(first).max_tokens == 50


def test_bucket_quota_learns_the_pace_offered_from_each_report() -> None:
    """(allowed + denied) per ms over the report's period: the demand a grant would meet."""
    r = rule(240, unit=Unit.MINUTE)
    limiter = LocalLimiter()
    quota = BucketQuota()
    quota.report(limiter, hit(r, "k", hits=1), T0 + 100)
    quota.report(limiter, hit(r, "k", hits=10), T0 + 5100, denied=10)
    assert quota.rate == 20 / 5000
    rechecked = quota.recheck(limiter, hit(r, "k", hits=0), T0 + 7600)
    assert rechecked is None  # 10 likely spent since: holds about what it should
