"""Rate Limit Quota Service semantics: usage reports in, bucket assignments out, no I/O.

A report's buckets are matched to rules (config/buckets.py) and overrides as ShouldRateLimit
requests are, their allowed requests counted into the same counters (core/quota_usage.py), and
only meaningful changes, new buckets, expiring and abandoned ones answered. A DENY_ALL is decided
again when its block ends (`due`). grpc_server/rlqs.py only converts messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ratelimit_sidecar.config.buckets import match_bucket
from ratelimit_sidecar.config.model import Rule, RuleSet
from ratelimit_sidecar.core import Hit, KeyId, Limiter
from ratelimit_sidecar.core.quota_assign import (
    DEFAULT_POLICY,
    Action,
    Assignment,
    QuotaPolicy,
)
from ratelimit_sidecar.core.quota_usage import BucketQuota
from ratelimit_sidecar.overrides.applied import NO_OVERRIDES, AppliedOverrides
from ratelimit_sidecar.service.ratelimit import MAX_HITS, _key
from ratelimit_sidecar.service.validation import Bounds, InvalidRequest, validate_entries

# A bucket's identity on a stream: its id's entries in key order.
BucketId = tuple[tuple[str, str], ...]
MAX_BUCKETS_PER_STREAM = 100_000
# A deny list's idle bucket is kept (its DENY_ALL refreshed) while its stream holds fewer buckets
# than this; past it, abandoned as any idle bucket (its next request passes by Envoy's fallback).
KEEP_DENIED_UNDER = 10_000


@dataclass(frozen=True, slots=True)
class Usage:
    bucket: Mapping[str, str]
    allowed: int
    denied: int


@dataclass(frozen=True, slots=True)
class BucketAction:
    """An assignment for the bucket, or (`Action.ABANDON`) abandon it."""

    bucket: BucketId
    assignment: Assignment


class QuotaObserver(Protocol):
    def reported(self, allowed: int, denied: int) -> None: ...

    def assigned(self, action: str) -> None: ...

    def streams(self, delta: int) -> None: ...

    def deny_list_abandoned(self) -> None: ...


@dataclass(slots=True)
class _Tracked:
    rules: RuleSet
    rule: Rule | None
    key: KeyId
    quota: BucketQuota = field(default_factory=BucketQuota)
    overrides: AppliedOverrides = NO_OVERRIDES


class QuotaService:
    """What every stream shares."""

    def __init__(
        self,
        rules: Callable[[], RuleSet],
        limiter: Limiter,
        clock_ms: Callable[[], int],
        *,
        bounds: Bounds | None = None,
        policy: QuotaPolicy = DEFAULT_POLICY,
        observer: QuotaObserver | None = None,
        overrides: Callable[[], AppliedOverrides] = lambda: NO_OVERRIDES,
    ) -> None:
        self.rules = rules  # read at each report: a reload applies at the next one
        self.overrides = overrides  # the handler's runtime overrides, read likewise
        self.limiter = limiter
        self.clock_ms = clock_ms
        self.bounds = bounds or Bounds()
        self.policy = policy
        self.observer = observer
        # How many streams report each counter: they split this node's share of it.
        self.holders: dict[KeyId, int] = {}

    def open_stream(self) -> QuotaStream:
        if self.observer is not None:
            self.observer.streams(1)
        return QuotaStream(self)

    def hold(self, key: KeyId, delta: int) -> None:
        count = self.holders.get(key, 0) + delta
        if count > 0:
            self.holders[key] = count
        else:
            self.holders.pop(key, None)


class QuotaStream:
    def __init__(self, service: QuotaService) -> None:
        self._service = service
        self.domain = ""
        self._buckets: dict[BucketId, _Tracked] = {}
        self._closed = False

    def report(self, domain: str, usages: Iterable[Usage]) -> list[BucketAction]:
        """Raises InvalidRequest, nothing counted, for a report that cannot be answered."""
        domain = self._domain(domain)
        checked = self._checked(usages)
        now = self._service.clock_ms()
        actions = [self._one(domain, bucket, usage, now) for bucket, usage in checked]
        return [action for action in actions if action is not None]

    def due(self) -> list[BucketAction]:
        """Buckets whose recheck has come: decided again, nothing counted."""
        now = self._service.clock_ms()
        due = [(b, t) for b, t in self._buckets.items() if 0 < t.quota.recheck_ms <= now]
        actions = [self._due(bucket, tracked, now) for bucket, tracked in due]
        return [action for action in actions if action is not None]

    def _due(self, bucket: BucketId, tracked: _Tracked, now: int) -> BucketAction | None:
        if tracked.quota.abandoned:  # Envoy dropped it and no request made it anew: forget it
            self._forget(bucket, tracked)
            return None
        return self._decide(bucket, tracked, None, now)

    def next_recheck_ms(self) -> int | None:
        rechecks = [t.quota.recheck_ms for t in self._buckets.values() if t.quota.recheck_ms]
        return min(rechecks, default=None)

    def close(self) -> None:
        """Its buckets no longer split this node's share."""
        if self._closed:
            return
        self._closed = True
        for tracked in self._buckets.values():
            self._service.hold(tracked.key, -1)
        self._buckets.clear()
        if self._service.observer is not None:
            self._service.observer.streams(-1)

    # -- one report ----------------------------------------------------------------------------

    def _domain(self, domain: str) -> str:
        """A later report may leave it out; one stream, one domain."""
        if not domain:
            if not self.domain:
                raise InvalidRequest("the first usage report must name its domain")
            return self.domain
        if self.domain and domain != self.domain:
            raise InvalidRequest(f"domain {domain!r} differs from the stream's {self.domain!r}")
        bounds = self._service.bounds
        if len(domain.encode()) > bounds.max_bytes:
            raise InvalidRequest(f"domain is longer than {bounds.max_bytes} bytes")
        self.domain = domain
        return domain

    def _checked(self, usages: Iterable[Usage]) -> list[tuple[BucketId, Usage]]:
        """New buckets counted as they come: one report cannot pass MAX_BUCKETS_PER_STREAM."""
        checked, new = [], set()
        for index, usage in enumerate(usages):
            bucket = self._bucket_id(index, usage)
            if bucket not in self._buckets:
                new.add(bucket)
                if len(self._buckets) + len(new) > MAX_BUCKETS_PER_STREAM:
                    raise InvalidRequest(
                        f"more than {MAX_BUCKETS_PER_STREAM} buckets on one stream"
                    )
            checked.append((bucket, usage))
        return checked

    def _bucket_id(self, index: int, usage: Usage) -> BucketId:
        entries = sorted(usage.bucket.items())
        if not entries:
            raise InvalidRequest(f"bucket {index} has an empty bucket id")
        validate_entries(index, entries, self._service.bounds)
        return tuple(entries)

    def _one(self, domain: str, bucket: BucketId, usage: Usage, now: int) -> BucketAction | None:
        service = self._service
        if service.observer is not None:
            service.observer.reported(usage.allowed, usage.denied)
        tracked = self._track(domain, bucket)
        hits = (min(usage.allowed, MAX_HITS), min(usage.denied, MAX_HITS))
        denied_for_good = tracked.quota.denies_for_good
        action = self._decide(bucket, tracked, hits, now)
        if tracked.quota.forgotten:  # idle: Envoy drops it, and so does this stream
            if denied_for_good and service.observer is not None:  # KEEP_DENIED_UNDER tripped
                service.observer.deny_list_abandoned()
            self._forget(bucket, tracked)
        return action

    def _track(self, domain: str, bucket: BucketId) -> _Tracked:
        """Matched again when the rules or overrides changed."""
        rules, overrides = self._service.rules(), self._service.overrides()
        tracked = self._buckets.get(bucket)
        if tracked is not None and tracked.rules is rules and tracked.overrides is overrides:
            return tracked
        found = rules.domain(domain)
        rule, entries = (None, list(bucket)) if found is None else match_bucket(found, dict(bucket))
        if overrides.rules:  # precedence as for ShouldRateLimit: override > rule files
            rule = overrides.rule(domain, tuple(entries), rule)
        key = _key(domain, entries, rule)
        if tracked is None:
            quota = BucketQuota(self._service.policy)
            tracked = self._buckets[bucket] = _Tracked(rules, rule, key, quota, overrides=overrides)
            self._service.hold(key, 1)
        elif key != tracked.key:
            self._service.hold(tracked.key, -1)
            self._service.hold(key, 1)
        tracked.rules, tracked.rule, tracked.key = rules, rule, key
        tracked.overrides = overrides
        return tracked

    def _decide(
        self, bucket: BucketId, tracked: _Tracked, hits: tuple[int, int] | None, now: int
    ) -> BucketAction | None:
        """`hits`: (allowed, denied); None: a recheck."""
        service = self._service
        streams = service.holders.get(tracked.key, 1)
        hit = Hit(tracked.rule, tracked.key, 0 if hits is None else hits[0])
        if hits is None:
            send = tracked.quota.recheck(service.limiter, hit, now, streams)
        else:
            keep = len(self._buckets) < KEEP_DENIED_UNDER
            quota = tracked.quota
            send = quota.report(
                service.limiter, hit, now, streams, denied=hits[1], keep_denied=keep
            )
        if send is None:
            return None
        if service.observer is not None:
            service.observer.assigned(send.action.value)
        return BucketAction(bucket, send)

    def _forget(self, bucket: BucketId, tracked: _Tracked) -> None:
        del self._buckets[bucket]
        self._service.hold(tracked.key, -1)


__all__ = ["Action", "BucketAction", "QuotaService", "QuotaStream", "Usage"]
