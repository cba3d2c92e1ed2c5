"""What an RLQS gateway may admit for one bucket: the quota assignment rule, pure.

An Envoy with the `rate_limit_quota` filter enforces a token bucket itself and reports its usage
every few seconds; the server answers with an assignment per bucket. This module turns what the
limiter knows about a counter (the fleet's remaining estimate, when it resets, whether it is
blocked, how many nodes share it) into that assignment, and says when a new one is worth
sending. No I/O and no clock: `now_ms` is a parameter.

The rule, for one limit of MAX per window W with capacity C (a token bucket's `burst`, else MAX):

- This gateway's share `s` is 1 / (nodes x streams): `nodes` is the counter's own estimate of
  how many nodes' worth of traffic one of this node's hits stands for (core/nodes_estimate.py),
  `streams` how many RLQS streams of this node report the bucket.
- Blocked (the count is known to be over), or nothing left: DENY_ALL until the block ends (or,
  with an estimate alone at zero, until room frees or the next sync), rounded up to whole
  seconds, and decided again then by the server.
- Otherwise a token bucket of `max_tokens` = s x what is left (at least 1, at most s x C),
  less, for a fixed window, what the gateway has likely admitted since its last report (`Pace`).
  Envoy builds every bucket the server sends full (see `replaces_bucket`), so `max_tokens` is
  what the gateway may spend from now on. It is sent when it differs meaningfully from what
  the bucket still holds (`settle`): smaller at once; larger, within a fixed window, only up to
  `grow_to`, what is left after the other gateways' usage this node cannot know yet (their
  reports are up to 5 s late), unless what is left covers the gateway's pace to the reset.
- How the bucket refills depends on the algorithm. A token bucket refills at s x MAX per W:
  Envoy's own shape, exact up to the share and the report delay. A window (fixed, sliding, log)
  frees capacity only when hits leave it, which the server sees and Envoy cannot: its bucket
  gets a token per fill interval of a window or more (without `tokens_per_fill` 1.40 never
  refills), and the server refills it at a fixed window's reset (a new bucket), as old spans
  leave a sliding one, and after each sync of the counter, at most once a second. A sliding
  log is rebalanced at span granularity, like a sliding window: not exact per request.
- Shadow-mode and unlimited rules, and buckets no rule matches: ALLOW_ALL. A deny list: DENY_ALL.

Envoy 1.40 facts the numbers respect: `fill_interval` is whole seconds (under 1 s: no limit),
`assignment_time_to_live` too (unset: expires at once), the same token bucket sent again keeps
its tokens and restarts the TTL (a resend renews without refilling), a different one starts with
the old one's fraction of tokens left (`replaces_bucket`), and only the nanos of `fill_interval`
are compared (so it depends on the limit alone, never on the share).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit

MS = 1000
# tokens_per_fill is a whole number: a fill interval long enough that the smallest share of
# MAX still gets about this many tokens per fill keeps the rounding error near 1 %.
FILL_RESOLUTION = 100
SYNC_MARGIN_MS = 250  # a span end's sync has answered by then


class Action(enum.Enum):
    ALLOW_ALL = "allow_all"
    DENY_ALL = "deny_all"
    TOKEN_BUCKET = "token_bucket"


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """Envoy's `envoy.type.v3.TokenBucket`, in its own units."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval_s: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """One bucket's assignment as sent at `issued_ms`; Envoy drops it `ttl_s` later.

    `recheck_ms` (0: none) is when the server should decide again without waiting for a report:
    a DENY_ALL's block ends, or a window frees capacity. `built_ms` is when Envoy built the
    bucket now holding these numbers (0: `issued_ms`); a resend of the same numbers keeps it."""

    action: Action
    ttl_s: int
    issued_ms: int
    bucket: TokenBucket | None = None
    recheck_ms: int = 0
    built_ms: int = 0
    # The fixed windows the bucket's share was taken from: a new window starts a new bucket.
    windows: tuple[int, ...] = ()
    # Envoy holds a token bucket this one replaces. Envoy 1.40 would keep the old one if the
    # numbers are the same, and start a different one with the fraction of tokens the old one
    # had left (a drained bucket stays drained); it builds a bucket full only where it held no
    # token bucket. So the servicer sends a blanket rule just before it, in the same response.
    replaces_bucket: bool = False
    grow_to: int = 0  # the most a bucket may grow to (0: `bucket.max_tokens`), see `settle`

    @property
    def expires_ms(self) -> int:
        return self.issued_ms + self.ttl_s * MS

    @property
    def since_ms(self) -> int:
        return self.built_ms or self.issued_ms


@dataclass(frozen=True, slots=True)
class KeyView:
    """What the limiter knows of one counter, read at the report."""

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
    """The knobs of the rule; the defaults fit Envoy 1.40, which reports every 5 s."""

    report_interval_ms: int = 5000
    ttl_s: int = 30  # how long Envoy keeps an assignment the server no longer refreshes
    change_ratio: float = 0.25  # a bucket's numbers must move this much to be sent again
    abandon_after_reports: int = 12  # idle (0 allowed, 0 denied) reports before abandoning
    min_recheck_ms: int = 1000  # Envoy counts TTLs in whole seconds: no finer rechecks
    shadow_mode: bool = False  # `--shadow-mode`: every bucket counted, and allowed
    # Within a fixed window a bucket grows only by what is left after the other gateways'
    # usage this node cannot know yet: up to a report period late (`_others_unreported`).
    others_late_ms: int = 5000
    cover: float = 0.8  # ... unless what is left covers this much of the gateway's pace

    @property
    def refresh_before_ms(self) -> int:
        """Send an unchanged assignment again when it would expire within two reports."""
        return 2 * self.report_interval_ms


DEFAULT_POLICY = QuotaPolicy()


@dataclass(frozen=True, slots=True)
class Pace:
    """A gateway's usage the counters do not have yet, from its reports: `rate_per_ms`, the
    requests it was offered per ms over its last report's period (allowed and denied), which
    stands for the other gateways' unreported pace too; `since_report_ms`, the time since that
    report; `held`, the most its bucket may still hold (what it can have spent since)."""

    rate_per_ms: float = 0.0
    since_report_ms: int = 0
    held: float = 0.0

    def unreported(self, limit: RateLimit, now_ms: int) -> float:
        """What the gateway has likely admitted since its report, in the current fixed window
        (0 for the other algorithms: in the simulator it helped none of them)."""
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
    """The assignment one limit's counter calls for now (see the module's rule); `pace`, the
    gateway's usage the counters do not have yet (see `Pace`)."""
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
    """This gateway's share of what the other gateways have likely admitted and this node does
    not know yet (a fixed window only): they are as late as a report period, and offered as
    much as this gateway's pace stands for ((1/share - 1) x its pace). Nothing while what is
    left covers `policy.cover` of this gateway's pace until the window ends: far from MAX,
    where holding a bucket back only refuses requests."""
    if limit.algorithm is not AlgorithmName.FIXED_WINDOW:
        return 0.0
    until_reset = limit.window_ms - now_ms % limit.window_ms
    if left >= policy.cover * pace.rate_per_ms * until_reset:
        return 0.0
    return (1.0 - share) * pace.rate_per_ms * _recent_ms(limit, now_ms, policy.others_late_ms)


def _recent_ms(limit: RateLimit, now_ms: int, span_ms: int) -> int:
    """The last `span_ms`, within the current fixed window only (what was admitted before it
    began counts in the window before)."""
    if limit.algorithm is AlgorithmName.FIXED_WINDOW:
        return max(0, min(span_ms, now_ms % limit.window_ms))
    return max(0, span_ms)


def _next_news(view: KeyView, policy: QuotaPolicy) -> int:
    """ms until what is left of a window can change: room frees, or the next sync brings the
    fleet's count (a margin after the span end, for the sync's round trip); 0: unknown."""
    synced = view.sync_ms + SYNC_MARGIN_MS if view.sync_ms > 0 else 0
    waits = [wait for wait in (view.reset_ms, synced) if wait > 0]
    return max(min(waits), policy.min_recheck_ms) if waits else 0


def allow_all(now_ms: int, policy: QuotaPolicy = DEFAULT_POLICY) -> Assignment:
    """No limit applies: unmatched bucket, unlimited or shadow-mode rule."""
    return Assignment(Action.ALLOW_ALL, policy.ttl_s, now_ms)


def deny_until(now_ms: int, wait_ms: int) -> Assignment:
    """DENY_ALL for `wait_ms`, re-decided then. The TTL outlasts the recheck by a second, so
    the new assignment arrives before Envoy drops this one (a gap would admit everything)."""
    ttl_s = max(1, math.ceil(wait_ms / MS)) + 1
    return Assignment(Action.DENY_ALL, ttl_s, now_ms, recheck_ms=now_ms + wait_ms)


def fill_interval_s(limit: RateLimit) -> int:
    """The limit's window, lengthened so tokens_per_fill stays a large whole number."""
    return limit.window_seconds * _fills(limit)


def _fills(limit: RateLimit) -> int:
    """How many windows one fill interval spans."""
    return max(1, math.ceil(FILL_RESOLUTION / max(limit.requests_per_unit, 1)))


def _tokens(left: float, capacity: float) -> int:
    """A burst of what is left, within the capacity, never zero (Envoy requires max_tokens > 0)."""
    return max(1, min(math.ceil(left), math.ceil(capacity)))


def settle(
    previous: Assignment | None,
    fresh: Assignment,
    now_ms: int,
    policy: QuotaPolicy = DEFAULT_POLICY,
    *,
    spent: int = 0,
    unreported: float = 0.0,
) -> Assignment | None:
    """What to send for a bucket: `fresh` when it differs meaningfully from what Envoy holds,
    `previous` again (same numbers, a new TTL) when that is about to expire, else None.

    `spent` (reported allowed since Envoy built `previous`'s bucket, with its refill since) less
    `unreported` (likely admitted since the last report) bounds what the bucket holds now. Envoy
    builds a bucket full whenever its numbers change, so one is sent only when what it starts
    with differs from that by over `change_ratio` (and a token), up to `grow_to` if larger."""
    if previous is None or previous.action is not fresh.action:
        denied = previous is not None and previous.action is Action.DENY_ALL
        return _grown(fresh) if denied else fresh  # after a DENY_ALL: a growth
    used = (spent, unreported)
    if previous.action is Action.TOKEN_BUCKET:
        moved = _moved(previous, fresh, now_ms, used, policy)
        if moved is not None:
            return replace(moved, replaces_bucket=True)
    if previous.action is Action.DENY_ALL and _deny_moved(previous, fresh, now_ms):
        return fresh
    if previous.action is Action.DENY_ALL and previous.recheck_ms > now_ms:
        return None  # decided again at the recheck, before it expires
    if previous.expires_ms - now_ms <= policy.refresh_before_ms:
        renewed = replace(previous, issued_ms=now_ms, built_ms=previous.since_ms)
        renewed = replace(renewed, replaces_bucket=False)  # the same bucket: Envoy keeps it
        return replace(renewed, recheck_ms=fresh.recheck_ms)
    return None


def kept(previous: Assignment, fresh: Assignment) -> Assignment:
    """What the server remembers of a bucket when `settle` sent nothing: Envoy's assignment,
    due to be decided again when `fresh` says (not at once, when a recheck has just run)."""
    if previous.recheck_ms == fresh.recheck_ms:
        return previous
    return replace(previous, recheck_ms=fresh.recheck_ms)


def _deny_moved(previous: Assignment, fresh: Assignment, now_ms: int) -> bool:
    """A longer block must be told; a DENY_ALL past its recheck is decided again anyway."""
    if previous.recheck_ms == fresh.recheck_ms:
        return False
    return fresh.expires_ms > previous.expires_ms or now_ms >= previous.recheck_ms


def _moved(
    previous: Assignment,
    fresh: Assignment,
    now_ms: int,
    used: tuple[int, float],
    policy: QuotaPolicy,
) -> Assignment | None:
    old, new = previous.bucket, fresh.bucket
    assert old is not None and new is not None
    if old.fill_interval_s != new.fill_interval_s:
        return fresh  # the limit itself changed (a reload)
    if previous.windows != fresh.windows:
        return fresh  # a new fixed window: the old one's tokens are gone
    ratio = policy.change_ratio
    if abs(new.tokens_per_fill - old.tokens_per_fill) > max(1.0, ratio * old.tokens_per_fill):
        return fresh
    spent, unreported = used
    held = max(0.0, held_tokens(old, (now_ms - previous.since_ms) / MS, spent) - unreported)
    if new.max_tokens < held:
        shrink = held - new.max_tokens > max(1.0, ratio * held)
        return fresh if shrink else None
    grown = _grown(fresh)
    assert grown.bucket is not None
    grow = grown.bucket.max_tokens
    return grown if grow - held > max(1.0, ratio * grow) else None


def _grown(fresh: Assignment) -> Assignment:
    """`fresh` as a bucket that grows may be sent: no larger than `grow_to`."""
    if fresh.bucket is None or not fresh.grow_to or fresh.grow_to >= fresh.bucket.max_tokens:
        return fresh
    return replace(fresh, bucket=replace(fresh.bucket, max_tokens=fresh.grow_to))


def held_tokens(bucket: TokenBucket, elapsed_s: float, spent: int) -> float:
    """At most what an Envoy bucket built full `elapsed_s` ago holds after `spent` tokens."""
    refilled = bucket.tokens_per_fill * max(0.0, elapsed_s) / bucket.fill_interval_s
    return max(0.0, min(float(bucket.max_tokens), bucket.max_tokens - spent + refilled))


def abandoned(idle_reports: int, policy: QuotaPolicy = DEFAULT_POLICY) -> bool:
    """A bucket reported idle (nothing allowed or denied) this many times in a row is
    abandoned: Envoy forgets it, and a new request makes it anew with an immediate report."""
    return idle_reports >= policy.abandon_after_reports
