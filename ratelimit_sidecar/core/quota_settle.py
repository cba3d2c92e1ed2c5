"""When an RLQS bucket's new assignment is worth sending (pure; `now_ms` a parameter).

Envoy 1.40 builds a token bucket full when it follows a DENY_ALL (or none), keeps its tokens when
the same bucket is sent again, and keeps the fraction it holds when a different one replaces it
(docs/RLQS-ENVOY.md). So a fresh assignment (core/quota_assign.py) is sent only when it differs
meaningfully from what the gateway's bucket still holds, and the same one again before its TTL
runs out.
"""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.core.quota_assign import (
    DEFAULT_POLICY,
    Action,
    Assignment,
    QuotaPolicy,
)


def settle(
    previous: Assignment | None,
    fresh: Assignment,
    now_ms: int,
    policy: QuotaPolicy = DEFAULT_POLICY,
    *,
    spent: int = 0,
    unreported: float = 0.0,
    trailing: bool = False,
) -> Assignment | None:
    """`fresh` if it differs meaningfully from what Envoy holds, `previous` again (a new TTL) when
    about to expire, else None. Envoy builds a changed bucket full: sent only when it differs from
    what the bucket holds now by over `change_ratio` and a token (up to `grow_to` if larger).
    `trailing`: a window freed as its spans leave, whose smaller bucket keeps Envoy's fraction."""
    if previous is None or previous.action is not fresh.action:
        denied = previous is not None and previous.action is Action.DENY_ALL
        return _grown(fresh) if denied else fresh  # after a DENY_ALL: a growth
    used = (spent, unreported)
    if previous.action is Action.TOKEN_BUCKET:
        moved = _moved(previous, fresh, now_ms, used, policy, trailing=trailing)
        if moved is not None:
            return moved
    if previous.action is Action.DENY_ALL and _deny_moved(previous, fresh, now_ms):
        return fresh
    if previous.action is Action.DENY_ALL and previous.recheck_ms > now_ms:
        return None  # decided again at the recheck, before it expires
    if previous.expires_ms - now_ms <= policy.refresh_before_ms:
        return renewed(previous, now_ms, fresh.recheck_ms)
    return None


def renewed(previous: Assignment, now_ms: int, recheck_ms: int) -> Assignment:
    """`previous` sent again for a new TTL: the same bucket, so Envoy keeps its tokens."""
    again = replace(previous, issued_ms=now_ms, built_ms=previous.since_ms, recheck_ms=recheck_ms)
    return replace(again, replaces_bucket=False)


def kept(previous: Assignment, fresh: Assignment) -> Assignment:
    """What the server remembers when `settle` sent nothing: due again when `fresh` says."""
    if previous.recheck_ms == fresh.recheck_ms:
        return previous
    return replace(previous, recheck_ms=fresh.recheck_ms)


def _deny_moved(previous: Assignment, fresh: Assignment, now_ms: int) -> bool:
    """A longer block must be told; one past its recheck is decided again anyway."""
    if previous.recheck_ms == fresh.recheck_ms:
        return False
    return fresh.expires_ms > previous.expires_ms or now_ms >= previous.recheck_ms


def _moved(
    previous: Assignment,
    fresh: Assignment,
    now_ms: int,
    used: tuple[int, float],
    policy: QuotaPolicy,
    *,
    trailing: bool,
) -> Assignment | None:
    old, new = previous.bucket, fresh.bucket
    assert old is not None and new is not None
    ratio = policy.change_ratio
    anew = (
        old.fill_interval_s != new.fill_interval_s  # the limit itself changed (a reload)
        or previous.windows != fresh.windows  # a new fixed window: the old tokens are gone
        or abs(new.tokens_per_fill - old.tokens_per_fill) > max(1.0, ratio * old.tokens_per_fill)
    )
    if anew:
        return replace(fresh, replaces_bucket=True)
    spent, unreported = used
    held = max(0.0, previous.held(now_ms, spent) - unreported)
    if new.max_tokens >= held:
        return _grown_over(fresh, held, ratio)
    if held - new.max_tokens <= max(1.0, ratio * held):
        return None
    if not trailing:
        return replace(fresh, replaces_bucket=True)
    # Alone: Envoy keeps the fraction its bucket holds. Built full, a trailing window's bucket
    # that a burst drained since its report took a new share of a count that lacked the burst
    # (simulator, 10 s, boundary bursts at twice MAX on 4 gateways: 282 of 240; 243 alone). In a
    # fixed window, whose pace counts what was likely spent, it refused more (docs/RLQS-LEASES.md).
    return replace(fresh, built_tokens=new.max_tokens * held / old.max_tokens)


def _grown_over(fresh: Assignment, held: float, ratio: float) -> Assignment | None:
    """A larger bucket, built full after a blanket rule (up to `grow_to`), if it is worth it."""
    grown = _grown(replace(fresh, replaces_bucket=True))
    assert grown.bucket is not None
    grow = grown.bucket.max_tokens
    return grown if grow - held > max(1.0, ratio * grow) else None


def _grown(fresh: Assignment) -> Assignment:
    if fresh.bucket is None or not fresh.grow_to or fresh.grow_to >= fresh.bucket.max_tokens:
        return fresh
    return replace(fresh, bucket=fresh.bucket._replace(max_tokens=fresh.grow_to))
