"""Metrics of the gRPC port's bounds, read from the transport at scrape time (nothing is
counted twice on the request path)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ratelimit_sidecar.metrics.labels import NS


class GrpcPortCollector(Collector):
    """`grpc_limit_trips_total{limit}`: how often each bound of the gRPC port tripped (the
    names are docs/TRANSPORT.md's); `grpc_pending_bytes`: request bytes held unfinished."""

    def __init__(self, trips: Callable[[], dict[str, int]], pending: Callable[[], int]) -> None:
        self._trips, self._pending = trips, pending

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{NS}_grpc_limit_trips", "Times a bound of the gRPC port tripped", labels=["limit"]
        )
        for name, count in sorted(self._trips().items()):
            family.add_metric([name], count)
        yield family
        yield GaugeMetricFamily(
            f"{NS}_grpc_pending_bytes",
            "Request bytes the gRPC port holds unfinished (bounded by --grpc-pending-bytes)",
            value=self._pending(),
        )
