"""The simulated sidecar's RLQS answers: the service's pure assignment rule, fed by the node.

Placeholder until the rule lands from the rlqs-service branch (core); the engine's RLQS
systems need it, everything else runs without.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_sidecar.core import Hit, Limiter
from ratelimit_sidecar.simulate.envoy_quota import EnvoyAssignment, Usage


class SidecarQuota:
    def report(
        self,
        limiter: Limiter,  # noqa: ARG002 - the placeholder answers nothing
        hits: Sequence[Hit],  # noqa: ARG002
        now_ms: int,  # noqa: ARG002
        usage: Usage,  # noqa: ARG002
    ) -> EnvoyAssignment | None:
        raise RuntimeError("the RLQS assignment rule is not in this build")
