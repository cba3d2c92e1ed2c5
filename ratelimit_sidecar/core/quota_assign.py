"""What an RLQS gateway may admit for one bucket (pure; `now_ms` is a parameter).

An Envoy with `rate_limit_quota` enforces a token bucket itself and reports usage every few seconds;
this turns what the limiter knows of a counter into that bucket's assignment, and says when a new
one is worth sending. For a limit of MAX per window W, capacity C:

- Share s = 1 / (nodes x streams): `nodes` from the counter's estimate (core/nodes_estimate.py),
  `streams` the RLQS streams of this node reporting the bucket.
- Blocked, or nothing left: DENY_ALL until the block ends (an estimate at zero: until room frees or
  the next sync), in whole seconds.
- Else a token bucket of s x what is left (1 to s x C), less, in a fixed window, what the gateway
  likely admitted since its report (`Pace`). Envoy builds every new bucket full, so `max_tokens` is
  what it may spend from now; sent when it differs meaningfully from what the bucket still holds
  (core/quota_settle.py), growing in a fixed window only up to `grow_to`: what is left after the
  other gateways' unreported usage (reports are up to 5 s late), unless it covers the gateway's
  pace to the reset.
  A trailing window's smaller bucket is not built full: Envoy keeps the fraction its bucket
  holds, so what a burst spent since the report stays spent (`built_tokens`).
- Refill: a token bucket's at s x MAX per W (Envoy's own shape). A window frees capacity only as
  hits leave it, which only the server sees: its bucket gets a token per fill interval (without one
  1.40 never refills) and the server refills it at a fixed window's reset, as a sliding one's spans
  leave, and after each sync, at most once a second.
- Shadow mode, unlimited and unmatched: ALLOW_ALL. A deny list: DENY_ALL.

Envoy 1.40: `fill_interval` and `assignment_time_to_live` are whole seconds (under 1 s: no limit;
TTL unset: expires at once); the same bucket sent again keeps its tokens and renews the TTL; a
different one starts with the old one's fraction left (`replaces_bucket`); only `fill_interval`'s
nanos are compared, so it depends on the limit alone.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit

MS = 1000
# tokens_per_fill is whole: this many tokens per fill keeps the rounding error near 1 %.
FILL_RESOLUTION = 100
SYNC_MARGIN_MS = 250  # a span end's sync has answered by then


class Action(enum.Enum):
    ALLOW_ALL = "allow_all"
    DENY_ALL = "deny_all"
    TOKEN_BUCKET = "token_bucket"
    ABANDON = "abandon"  # not an assignment: Envoy drops the bucket and its unreported usage


class TokenBucket(NamedTuple):
    """Envoy's `envoy.type.v3.TokenBucket`, in its own units."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval_s: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """Dropped by Envoy `ttl_s` after `issued_ms`. `recheck_ms` (0: none): decide again without a
    report. `built_ms` (0: `issued_ms`): when Envoy built the bucket holding these numbers."""

    action: Action
    ttl_s: int
    issued_ms: int
    bucket: TokenBucket | None = None
    recheck_ms: int = 0
    built_ms: int = 0
    windows: tuple[int, ...] = ()  # the fixed windows of its share: a new one, a new bucket
    # Envoy would start a different bucket with the old one's fraction left (a drained one stays
    # drained), full only where it held none: so a blanket rule goes just before it (not before
    # a trailing window's smaller bucket, see core/quota_settle.py).
    replaces_bucket: bool = False
    grow_to: int = 0  # the most a bucket may grow to (0: `bucket.max_tokens`): quota_settle.py
    built_tokens: float | None = None  # what Envoy's bucket held when built (None: full)

    @property
    def expires_ms(self) -> int:
        return self.issued_ms + self.ttl_s * MS

    @property
    def since_ms(self) -> int:
        return self.built_ms or self.issued_ms

    def held(self, now_ms: int, spent: int) -> float:
        """At most what Envoy's bucket holds at `now_ms`, `spent` reported since its build."""
        assert self.bucket is not None
        elapsed_s = (now_ms - self.since_ms) / MS
        return held_tokens(self.bucket, elapsed_s, spent, self.built_tokens)


@dataclass(frozen=True, slots=True)
class KeyView:
    limit: RateLimit
    remaining: int  # what the fleet may still admit (the limiter's estimate)
    blocked_ms: int = 0  # until the counter's block ends; 0: not blocked
    nodes: float = 1.0  # nodes' worth of traffic one of this node's hits stands for
    shadow: bool = False
    reset_ms: int = 0  # until the counter frees capacity (its answer's reset); 0: unknown
    sync_ms: int = 0  # until this node next learns the fleet's count (its span end); 0: unknown
    window: int = -1  # a fixed window's index (-1: another algorithm)


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    """Defaults fit Envoy 1.40, which reports every 5 s."""

    report_interval_ms: int = 5000
    ttl_s: int = 30  # how long Envoy keeps an assignment the server no longer refreshes
    change_ratio: float = 0.25  # a bucket's numbers must move this much to be sent again
    abandon_after_reports: int = 12  # idle (0 allowed, 0 denied) reports before abandoning
    min_recheck_ms: int = 1000  # Envoy counts TTLs in whole seconds: no finer rechecks
    shadow_mode: bool = False  # `--shadow-mode`: every bucket counted, and allowed
    others_late_ms: int = 5000  # how late the other gateways' usage may be (`_others_unreported`)
    cover: float = 0.8  # ... unless what is left covers this much of the gateway's pace
    lease_from: float = 0.95  # an edge window after one this near MAX is leased (quota_windows)
    # A trailing window at the edge is leased for a window once the fleet's offered pace reaches
    # this many MAX a window: blended over reports, or in one report (quota_windows).
    trailing_near: tuple[float, float] = (1.5, 2.0)

    @property
    def refresh_before_ms(self) -> int:
        return 2 * self.report_interval_ms

    @property
    def edge_over_ms(self) -> int:
        """A counter fed by reports keeps `consistency: edge` in a window longer than this (12
        reports): there a report's lag is small against the window, and pushing the counter fast
        near MAX holds it (simulator, 2,000 a day at twice MAX on 4 gateways: at most 2,006,
        eventual 2,265). In shorter windows the usage a gateway has not reported yet is what
        passes MAX, which no push reaches: it refused more and held no better (240 per 10 s);
        there a window after one near MAX is leased instead (core/quota_windows.py)."""
        return self.abandon_after_reports * self.report_interval_ms

    @property
    def paced_within_ms(self) -> int:
        """A sliding window at the edge up to this long is leased by its pace (quota_windows)."""
        return 2 * self.report_interval_ms

    @property
    def forget_ms(self) -> int:
        """A lease bucket abandoned at its window's end, not made anew since: forgotten."""
        return self.abandon_after_reports * self.report_interval_ms


DEFAULT_POLICY = QuotaPolicy()


@dataclass(frozen=True, slots=True)
class Pace:
    """A gateway's usage the counters lack: `rate_per_ms` offered over its last report's period
    (the other gateways' pace too), and `held`, the most its bucket may still hold."""

    rate_per_ms: float = 0.0
    since_report_ms: int = 0
    held: float = 0.0

    def unreported(self, limit: RateLimit, now_ms: int) -> float:
        """Likely admitted since the report, in a fixed window (others: 0, it helped none)."""
        if limit.algorithm is not AlgorithmName.FIXED_WINDOW:
            return 0.0
        return min(self.held, self.rate_per_ms * _recent_ms(limit, now_ms, self.since_report_ms))


def assign(
    view: KeyView,
    now_ms: int,
    streams: int = 1,
    policy: QuotaPolicy = DEFAULT_POLICY,
    pace: Pace | None = None,
) -> Assignment:
    pace = pace or Pace()
    limit = view.limit
    if view.shadow:
        return allow_all(now_ms, policy)
    if limit.requests_per_unit == 0:
        return Assignment(Action.DENY_ALL, policy.ttl_s, now_ms)
    if view.blocked_ms > 0:
        return deny_until(now_ms, view.blocked_ms)
    if view.remaining <= 0:  # by the estimate alone: decided again when it can change
        return deny_until(now_ms, _next_news(view, policy) or policy.report_interval_ms)
    share = 1.0 / (max(view.nodes, 1.0) * max(streams, 1))
    left = view.remaining * share - pace.unreported(limit, now_ms)
    max_tokens = _tokens(left, limit.capacity * share)
    grow_to = _tokens(
        left - _others_unreported(limit, now_ms, share, left, pace=pace, policy=policy), max_tokens
    )
    interval = fill_interval_s(limit)
    if limit.algorithm is AlgorithmName.TOKEN_BUCKET:
        per_fill = max(1, round(limit.requests_per_unit * share * _fills(limit)))
        bucket = TokenBucket(max_tokens, per_fill, interval)
        return Assignment(Action.TOKEN_BUCKET, policy.ttl_s, now_ms, bucket, grow_to=grow_to)
    news = _next_news(view, policy)
    bucket = TokenBucket(max_tokens, 1, interval)  # the server refills a window
    windows = (view.window,) if view.window >= 0 else ()
    recheck = now_ms + news if news else 0
    return Assignment(
        Action.TOKEN_BUCKET, policy.ttl_s, now_ms, bucket, recheck, windows=windows, grow_to=grow_to
    )


def _others_unreported(
    limit: RateLimit, now_ms: int, share: float, left: float, *, pace: Pace, policy: QuotaPolicy
) -> float:
    """This gateway's share of the others' likely unreported admissions (fixed window only); none
    while what is left covers `policy.cover` of the pace: far from MAX, holding back refuses."""
    if limit.algorithm is not AlgorithmName.FIXED_WINDOW:
        return 0.0
    until_reset = limit.window_ms - now_ms % limit.window_ms
    if left >= policy.cover * pace.rate_per_ms * until_reset:
        return 0.0
    return (1.0 - share) * pace.rate_per_ms * _recent_ms(limit, now_ms, policy.others_late_ms)


def _recent_ms(limit: RateLimit, now_ms: int, span_ms: int) -> int:
    """The last `span_ms`, within the current fixed window (earlier hits count in the last)."""
    if limit.algorithm is AlgorithmName.FIXED_WINDOW:
        return max(0, min(span_ms, now_ms % limit.window_ms))
    return max(0, span_ms)


def _next_news(view: KeyView, policy: QuotaPolicy) -> int:
    """ms until room frees or the next sync answers; 0: unknown."""
    synced = view.sync_ms + SYNC_MARGIN_MS if view.sync_ms > 0 else 0
    waits = [wait for wait in (view.reset_ms, synced) if wait > 0]
    return max(min(waits), policy.min_recheck_ms) if waits else 0


def allow_all(now_ms: int, policy: QuotaPolicy = DEFAULT_POLICY) -> Assignment:
    return Assignment(Action.ALLOW_ALL, policy.ttl_s, now_ms)


def deny_until(now_ms: int, wait_ms: int) -> Assignment:
    """The TTL outlasts the recheck by a second: a gap would admit everything."""
    ttl_s = max(1, math.ceil(wait_ms / MS)) + 1
    return Assignment(Action.DENY_ALL, ttl_s, now_ms, recheck_ms=now_ms + wait_ms)


def fill_interval_s(limit: RateLimit) -> int:
    """The window, lengthened so tokens_per_fill stays a large whole number."""
    return limit.window_seconds * _fills(limit)


def _fills(limit: RateLimit) -> int:
    return max(1, math.ceil(FILL_RESOLUTION / max(limit.requests_per_unit, 1)))


def _tokens(left: float, capacity: float) -> int:
    """Never zero: Envoy requires max_tokens > 0."""
    return max(1, min(math.ceil(left), math.ceil(capacity)))


def held_tokens(
    bucket: TokenBucket, elapsed_s: float, spent: int, built: float | None = None
) -> float:
    """At most what a bucket built `elapsed_s` ago holding `built` (None: full) holds after
    `spent` tokens."""
    start = bucket.max_tokens if built is None else built
    refilled = bucket.tokens_per_fill * max(0.0, elapsed_s) / bucket.fill_interval_s
    return max(0.0, min(float(bucket.max_tokens), start - spent + refilled))


def abandoned(idle_reports: int, policy: QuotaPolicy = DEFAULT_POLICY) -> bool:
    """Idle this many reports in a row: Envoy forgets the bucket; a new request makes it anew."""
    return idle_reports >= policy.abandon_after_reports
