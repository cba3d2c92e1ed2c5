"""The simulated sidecar's RLQS answers for one gateway: the service's rule, fed by the node.

Nothing here decides: a report goes through `core.quota_usage.report_usage` (the allowed
requests counted into the node's own counters, then the assignment read off them) and
`core.quota_assign.settle` (send it only when it moved meaningfully, or to renew the TTL),
as the servicer does. A DENY_ALL carries a recheck time: the servicer decides again then,
without waiting for a report (`recheck`), so a block's end reaches Envoy at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_sidecar.core import Hit, Limiter
from ratelimit_sidecar.core.quota_assign import Action as CoreAction
from ratelimit_sidecar.core.quota_assign import Assignment, settle
from ratelimit_sidecar.core.quota_usage import report_usage
from ratelimit_sidecar.simulate.envoy_quota import Action, EnvoyAssignment, Usage

ACTIONS = {
    CoreAction.ALLOW_ALL: Action.ALLOW_ALL,
    CoreAction.DENY_ALL: Action.DENY_ALL,
    CoreAction.TOKEN_BUCKET: Action.TOKEN_BUCKET,
}


def on_the_wire(assignment: Assignment) -> EnvoyAssignment:
    """What Envoy receives: whole seconds, as the protos carry them."""
    bucket = assignment.bucket
    if bucket is None:
        return EnvoyAssignment(ACTIONS[assignment.action], assignment.ttl_s * 1000)
    return EnvoyAssignment(
        Action.TOKEN_BUCKET,
        assignment.ttl_s * 1000,
        bucket.max_tokens,
        bucket.tokens_per_fill,
        bucket.fill_interval_s * 1000,
    )


class SidecarQuota:
    """One gateway's RLQS stream to its sidecar node, for the simulated bucket."""

    def __init__(self) -> None:
        self.sent: Assignment | None = None  # what Envoy holds, as the servicer remembers it

    @property
    def recheck_ms(self) -> int:
        """When the last DENY_ALL is to be decided again (node clock); 0: none pending."""
        return self.sent.recheck_ms if self.sent is not None else 0

    def report(
        self, limiter: Limiter, hits: Sequence[Hit], now_ms: int, usage: Usage
    ) -> EnvoyAssignment | None:
        hit = hits[0]._replace(hits=usage.allowed)
        return self._send(report_usage(limiter, hit, now_ms), now_ms)

    def recheck(self, limiter: Limiter, hits: Sequence[Hit], now_ms: int) -> EnvoyAssignment | None:
        """No report: the same rule on the counters as they are now (nothing counted)."""
        return self._send(report_usage(limiter, hits[0]._replace(hits=0), now_ms), now_ms)

    def _send(self, fresh: Assignment, now_ms: int) -> EnvoyAssignment | None:
        chosen = settle(self.sent, fresh, now_ms)
        if chosen is None:
            return None
        self.sent = chosen
        return on_the_wire(chosen)
