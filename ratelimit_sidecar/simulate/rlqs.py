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
from ratelimit_sidecar.simulate.envoy_quota import EnvoyAssignment, EnvoyBucket, Usage


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
    rebuilds: int = 0  # token buckets Envoy built (one per assignment change)
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


def leave(bucket: EnvoyBucket, stats: RlqsStats, now: int) -> None:
    """The gateway stops: what it allowed since its last report is never reported."""
    before = bucket.lost
    bucket.drop_usage(now)
    stats.lost_hits += bucket.lost - before
