"""What the handler tells the metrics about its decisions (metrics/registry.py's Metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ratelimit_sidecar.core import Decision, Hit, Verdict
from ratelimit_sidecar.metrics.hot import Tally


class DecisionObserver(Protocol):
    """`tally` once per distinct request, its counters kept with the compiled request; then
    `decided` after each decision of that request, or `admitted` when the fast path admitted
    its one counted descriptor (at `index`: service/fast_path.py)."""

    def tally(self, domain: str, hits: Sequence[Hit]) -> Tally: ...

    def decided(self, tally: Tally, decision: Decision) -> None: ...

    def admitted(self, tally: Tally, index: int, verdict: Verdict) -> None: ...

    def unknown_domain(self, domain: str) -> None: ...
