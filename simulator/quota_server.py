"""The simulated sidecar's RLQS answers for one gateway: the service's rule, fed by the node.

Nothing here decides: every report and recheck goes through `core.quota_usage.BucketQuota`,
the bookkeeping the servicer keeps per bucket (the allowed requests counted into the node's own
counters, the assignment read off them, sent only when it moved meaningfully or to renew the
TTL). An assignment may carry a recheck time: the servicer decides again then, without waiting
for a report, so a block's end (or a window's reset) reaches Envoy at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_sidecar.core import Hit, Limiter
from ratelimit_sidecar.core.quota_assign import Action, Assignment
from ratelimit_sidecar.core.quota_usage import BucketQuota
from simulator.envoy_quota import EnvoyAssignment, Usage


def on_the_wire(assignment: Assignment) -> EnvoyAssignment:
    """What Envoy receives: whole seconds, as the protos carry them."""
    bucket = assignment.bucket
    if assignment.action is Action.ABANDON:
        return EnvoyAssignment(Action.ABANDON)
    if bucket is None:
        return EnvoyAssignment(assignment.action, assignment.ttl_s * 1000)
    return EnvoyAssignment(
        Action.TOKEN_BUCKET,
        assignment.ttl_s * 1000,
        bucket.max_tokens,
        bucket.tokens_per_fill,
        bucket.fill_interval_s * 1000,
        # grpc_server/rlqs.py sends a DENY_ALL just before a bucket that replaces another
        after_blanket=assignment.replaces_bucket,
    )


class SidecarQuota:
    """One gateway's RLQS stream to its sidecar node, for the simulated bucket."""

    def __init__(self) -> None:
        self.bucket = BucketQuota()  # what the servicer remembers of the bucket

    @property
    def recheck_ms(self) -> int:
        """When to decide again without a report (node clock); 0: not planned."""
        return self.bucket.recheck_ms

    def report(
        self, limiter: Limiter, hits: Sequence[Hit], now_ms: int, usage: Usage
    ) -> EnvoyAssignment | None:
        hit = hits[0]._replace(hits=usage.allowed)
        answer = _wire(self.bucket.report(limiter, hit, now_ms, denied=usage.denied))
        if self.bucket.forgotten:  # idle: the servicer drops it (service/quota.py)
            self.bucket = BucketQuota(self.bucket.policy)
        return answer

    def recheck(self, limiter: Limiter, hits: Sequence[Hit], now_ms: int) -> EnvoyAssignment | None:
        """No report: the same rule on the counters as they are now (nothing counted). A bucket
        abandoned and not made anew by its recheck is forgotten (service/quota.py)."""
        if self.bucket.abandoned:
            self.bucket = BucketQuota(self.bucket.policy)
            return None
        return _wire(self.bucket.recheck(limiter, hits[0], now_ms))


def _wire(sent: Assignment | None) -> EnvoyAssignment | None:
    return None if sent is None else on_the_wire(sent)
