"""What an RLQS bucket reads off the limiter's counters (pure; `now_ms` a parameter).

A report's allowed requests were admitted by Envoy already: `Limiter.count_admitted` counts them
into the same counters (so the same span deltas and store keys) as ShouldRateLimit requests with
that descriptor, and the plain assignment is read off them (`report_usage`, core/quota_assign.py);
a leased counter is read as what its window has free (`free_of`, core/quota_lease.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.limiter import Limiter
from ratelimit_sidecar.core.quota_assign import (
    DEFAULT_POLICY,
    Action,
    Assignment,
    KeyView,
    Pace,
    QuotaPolicy,
    TokenBucket,
    allow_all,
    assign,
)
from ratelimit_sidecar.core.quota_lease import Free
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.types import Hit

TRAILING = (AlgorithmName.SLIDING_WINDOW, AlgorithmName.SLIDING_LOG)


def report_usage(
    limiter: Limiter,
    hit: Hit,
    now_ms: int,
    streams: int = 1,
    policy: QuotaPolicy = DEFAULT_POLICY,
    *,
    since_ms: int | None = None,
    pace: Pace | None = None,
    nodes: float = 0.0,
) -> Assignment:
    """Count a report's allowed hits (admitted since `since_ms`) and return the assignment;
    `nodes` > 0 stands for every counter's nodes estimate (`BucketQuota.report_nodes`)."""
    # Shadow mode still counts.
    states = limiter.count_admitted(now_ms, hit, since_ms, edge_over_ms=policy.edge_over_ms)
    rule = hit.rule
    if rule is None or rule.limit is None or rule.shadow_mode or policy.shadow_mode:
        return allow_all(now_ms, policy)
    counted = zip(rule.limits, states, strict=True)
    views = [view_of(limiter, limit, state, now_ms) for limit, state in counted]
    if nodes > 0:
        views = [replace(view, nodes=nodes) for view in views]
    return combine([assign(view, now_ms, streams, policy, pace) for view in views])


def combine(assignments: Sequence[Assignment]) -> Assignment:
    """Any DENY_ALL (the longest), else the smallest burst, slowest refill and earliest recheck."""
    if len(assignments) == 1:
        return assignments[0]
    denials = [a for a in assignments if a.action is Action.DENY_ALL]
    if denials:
        return max(denials, key=lambda a: (a.recheck_ms == 0, a.recheck_ms, a.ttl_s))
    buckets = [a for a in assignments if a.bucket is not None]
    if not buckets:
        return assignments[0]
    slowest = min(buckets, key=lambda a: _rate(a.bucket))
    smallest = min(b.bucket.max_tokens for b in buckets if b.bucket is not None)
    recheck = min((b.recheck_ms for b in buckets if b.recheck_ms), default=0)
    assert slowest.bucket is not None
    bucket = slowest.bucket._replace(max_tokens=smallest)
    windows = tuple(w for b in buckets for w in b.windows)
    return replace(slowest, bucket=bucket, recheck_ms=recheck, windows=windows)


def _rate(bucket: TokenBucket | None) -> float:
    assert bucket is not None
    return bucket.tokens_per_fill / bucket.fill_interval_s


def view_of(limiter: Limiter, limit: RateLimit, state: KeyState | None, now_ms: int) -> KeyView:
    """Without a counter (a deny list, a table full of blocked keys): the limit alone."""
    if state is None:
        return KeyView(limit, limit.capacity if limit.requests_per_unit else 0)
    algorithm = limiter.algorithm_of(state)
    answer = algorithm.admitted(state, now_ms)  # what is left, and when room frees
    blocked_ms = algorithm.wait_ms(state, 0, now_ms) if now_ms < state.blocked_until else 0
    sync_ms = max(1, state.next_sync - now_ms)  # due now (a push asked for): news soon
    fixed = limit.algorithm is AlgorithmName.FIXED_WINDOW
    return KeyView(
        limit,
        answer.remaining,
        blocked_ms,
        state.nodes.value,
        state.rule.shadow_mode,
        answer.reset_ms,
        sync_ms,
        state.window if fixed else -1,
    )


def trailing(rule: Rule | None) -> bool:
    """Whether every limit of `rule` is a trailing window: freed as its spans leave, so the server
    refills its buckets, and a smaller one keeps Envoy's fraction (core/quota_settle.py)."""
    if rule is None or not rule.limits:
        return False
    return all(limit.algorithm in TRAILING for limit in rule.limits)


def likely_unreported(rule: Rule, pace: Pace, now_ms: int) -> float:
    """Likely spent since the report, under the rule's tightest limit."""
    return max((pace.unreported(limit, now_ms) for limit in rule.limits), default=0.0)


def free_of(limiter: Limiter, state: KeyState, now_ms: int, streams: int) -> Free:
    limit = state.limit
    return Free(
        limit.requests_per_unit,
        limit.requests_per_unit - limiter.leased_count(state, now_ms),
        limit.window_ms - now_ms % limit.window_ms,
        max(1, state.next_sync - now_ms),
        limiter.live_nodes,
        max(1, streams),
        _heard(state),
        state.nodes.value,
        not isinstance(state.counts, SpanState),
    )


def _heard(state: KeyState) -> bool:
    """Whether the node read the store's count of the counter (a node just started has not)."""
    counts = state.counts
    if isinstance(counts, SpanState):
        return counts.pushed_span >= 0  # a store's answer read
    counts = state.window_counts()
    return counts.pushed or counts.seen_ms > 0 or counts.seen > 0
