"""Metrics of progressive penalties (core/penalty.py), read from the limiter at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ratelimit_sidecar.core import Limiter
from ratelimit_sidecar.metrics.labels import NS


class PenaltyCollector(Collector):
    """`penalties_applied_total`: offences that raised a key's level, seen by this node (one
    per key and block at most); `keys_under_penalty{level}`: tracked keys at each level > 0."""

    def __init__(self, limiter: Limiter, now_ms: Callable[[], int]) -> None:
        self._limiter, self._now_ms = limiter, now_ms

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            f"{NS}_penalties_applied",
            "Offences (requests sent before their Retry-After) that made a key's next block longer",
            value=self._limiter.penalties.applied,
        )
        family = GaugeMetricFamily(
            f"{NS}_keys_under_penalty", "Tracked keys by penalty level (above 0)", labels=["level"]
        )
        for level, keys in sorted(self._limiter.penalty_levels(self._now_ms()).items()):
            family.add_metric([str(level)], keys)
        yield family
