"""Gateways on the Rate Limit Quota Service beside gateways on ShouldRateLimit (issue #17).

An RLQS gateway's requests never reach its sidecar: its Envoy decides them (envoy_quota.py)
and reports usage every 5 s. The sidecar node behind it is the same simulated node as an RLS
gateway's (a `FleetLimiter` syncing with the shared store); a report turns into hits in that
node's counters and the answer is computed from that node's state by the service's pure
assignment rule (`QuotaServer`). So RLQS and RLS gateways count against one global limit.

Which gateways use RLQS: `rlqs_gateways` of them (the first ones) when set, else the
system's share (1 = all, 0.5 = every other one), so any scenario can run with some or all
gateways on RLQS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ratelimit_sidecar.core import Hit, Limiter
from simulator.envoy_quota import (
    REPORT_PERIOD_MS,
    EnvoyAssignment,
    EnvoyBucket,
    Usage,
)


class QuotaServer(Protocol):
    """One gateway's stream to its sidecar for the simulated key (the service's rule decides:
    quota_server.py). Times are the node's clock."""

    @property
    def recheck_ms(self) -> int:
        """When the server decides again without a report; 0: not planned."""
        ...

    def report(
        self, limiter: Limiter, hits: Sequence[Hit], now_ms: int, usage: Usage
    ) -> EnvoyAssignment | None:
        """Count the usage into `limiter`, then the bucket's assignment (None: no change)."""
        ...

    def recheck(self, limiter: Limiter, hits: Sequence[Hit], now_ms: int) -> EnvoyAssignment | None:
        """Decide again on the counters as they are (None: no change)."""
        ...


def window_bound(capacity: int, builds: int, refill: float) -> int:
    """The most an RLQS fleet admits in one window in which no gateway's bucket was built full
    more than `builds` times, while every gateway holds an assignment and the shares add up to
    at most 1 (docs/ACCURACY.md, "RLQS gateways").

    A gateway's bucket never holds more than its share s of the capacity C; Envoy hands it a
    full bucket again only when it builds one (a first assignment, or one after a DENY_ALL,
    which the servicer puts before every bucket that replaces another); a bucket rescaled by
    Envoy gains at most s x C too. Add what its bucket held when the window began, and the
    refill over the window (s x MAX for a token bucket rule, a token per fill interval for a
    window's): s x (C x (1 + builds) + refill) per gateway, summed with s = 1."""
    return math.ceil(capacity * (1 + builds) + refill)


@dataclass(frozen=True)
class RlqsPlan:
    """Which nodes are RLQS gateways, and when their RLQS server is unreachable."""

    share: float  # of the gateways on RLQS, when `count` is None
    count: int | None
    outages: tuple[tuple[int, int], ...]  # true ms: the server unreachable in [start, end)

    def uses_rlqs(self, index: int) -> bool:
        if self.count is not None:
            return index < self.count
        # every k-th node for a share of 1/k: spread over the fleet, never all first
        return math.floor((index + 1) * self.share) > math.floor(index * self.share)

    def reachable(self, now_ms: int) -> bool:
        return not any(a <= now_ms < b for a, b in self.outages)


@dataclass
class RlqsStats:
    """What the RLQS gateways did, beside the decisions the recorder sees."""

    reports: int = 0
    lost_reports: int = 0
    lost_hits: int = 0  # allowed by Envoy, never reported (server unreachable, or leaving)
    rebuilds: int = 0  # token buckets Envoy built full
    gateways: int = 0


def report(
    bucket: EnvoyBucket,
    server: QuotaServer,
    plan: RlqsPlan,
    stats: RlqsStats,
    call: tuple[Limiter, Sequence[Hit], int, int],
) -> None:
    """One report of one gateway's bucket at true time `now`: sent, answered and applied; or,
    with the server unreachable, its usage lost. `call` is (limiter, hits, now, node clock)."""
    limiter, hits, now, node_now = call
    if bucket.new and not (bucket.allowed or bucket.denied):
        return  # Envoy makes a bucket at its first request: nothing to report before
    stats.reports += 1
    if not plan.reachable(now):
        before = bucket.lost
        bucket.drop_usage(now)
        stats.lost_reports += 1
        stats.lost_hits += bucket.lost - before
        return
    usage = bucket.take_usage(now)
    deliver(bucket, stats, now, server.report(limiter, hits, node_now, usage))


def deliver(
    bucket: EnvoyBucket, stats: RlqsStats, now: int, answer: EnvoyAssignment | None
) -> None:
    """An answer reaches Envoy (the sidecar is local: at once)."""
    if answer is not None:
        before = bucket.rebuilds
        bucket.assign(now, answer)
        stats.rebuilds += bucket.rebuilds - before


# What a gateway's event is: Envoy's 5 s timer, a new bucket's first request, the server's recheck.
PERIODIC, FIRST, RECHECK = "periodic", "first", "recheck"
Planned = list[tuple[int, str]]  # events to schedule: (true ms, kind)


class Gateway:
    """An RLQS gateway beside its sidecar node: its Envoy bucket and its stream's server side.
    Events come in through `handle`; what it returns is for the engine to schedule."""

    def __init__(self, quota: QuotaServer, offset: int) -> None:
        self.envoy, self.quota, self.offset = EnvoyBucket(), quota, offset
        self.recheck_at = 0  # true ms of the server's planned recheck (0: none)

    def admit(self, t: int) -> tuple[bool, bool]:
        """Envoy decides alone: (admitted, whether this new bucket's report goes out now)."""
        first = self.envoy.new and not self.envoy.allowed + self.envoy.denied
        return self.envoy.admit(t), first

    def handle(
        self,
        kind: str,
        now: int,
        node: tuple[Limiter, Sequence[Hit]],
        plan: RlqsPlan,
        stats: RlqsStats,
    ) -> Planned:
        limiter, hits = node
        planned: Planned = []
        if kind == RECHECK:
            if now != self.recheck_at or not plan.reachable(now):
                return planned  # superseded by a later plan, or the stream is down
            self.recheck_at = 0
            answer = self.quota.recheck(limiter, hits, now + self.offset)
            deliver(self.envoy, stats, now, answer)
        else:
            report(self.envoy, self.quota, plan, stats, (limiter, hits, now, now + self.offset))
            if kind == PERIODIC:
                planned.append((now + REPORT_PERIOD_MS, PERIODIC))
        return planned + self._plan_recheck(now)

    def _plan_recheck(self, now: int) -> Planned:
        """The server decides a DENY_ALL again when its block ends (one timer per stream)."""
        at = self.quota.recheck_ms - self.offset if self.quota.recheck_ms else 0
        if at <= now or at == self.recheck_at:
            return []
        self.recheck_at = at
        return [(at, RECHECK)]


def leave(bucket: EnvoyBucket, stats: RlqsStats, now: int) -> None:
    """The gateway stops: what it allowed since its last report is never reported."""
    before = bucket.lost
    bucket.drop_usage(now)
    stats.lost_hits += bucket.lost - before
