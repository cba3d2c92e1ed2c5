"""Decision counters and a latency histogram cheap enough for every request.

prometheus-client's Counter.inc and Histogram.observe take a lock per call, a cost on the
request path. The sidecar decides on one event-loop thread, so plain integers suffice;
a collector turns them into Prometheus families at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# Each counter of a rule and the metric it becomes.
DECISION_COUNTERS: Final = (
    ("total", "total_hits", "Descriptors checked against a rule"),
    ("within", "within_limit", "Descriptors answered OK"),
    ("near", "near_limit", "Answered OK with --near-limit-ratio (0.8) or more of the limit used"),
    ("over", "over_limit", "Descriptors answered OVER_LIMIT"),
    ("shadow", "shadow_mode", "Over the limit, let through by shadow mode"),
)


class RuleCounts:
    """One rule's decision counters: attributes, not a list's items, which every decision would
    box and unbox (docs/PERFORMANCE.md)."""

    __slots__ = ("near", "over", "shadow", "total", "within")

    def __init__(self) -> None:
        self.total = self.within = self.near = self.over = self.shadow = 0


# The counts of one request's descriptors, in order; None where no limit applies. The
# handler keeps it with the request it has compiled, so counting costs no lookup.
Tally = tuple[RuleCounts | None, ...]


class DecisionCounts(Collector):
    """Per (domain, rule label): its RuleCounts."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self.by_rule: dict[tuple[str, str], RuleCounts] = {}

    def counts(self, domain: str, label: str) -> RuleCounts:
        found = self.by_rule.get((domain, label))
        if found is None:
            found = self.by_rule[(domain, label)] = RuleCounts()
        return found

    def collect(self) -> Iterable[CounterMetricFamily]:
        items = list(self.by_rule.items())
        for attribute, name, doc in DECISION_COUNTERS:
            family = CounterMetricFamily(
                f"{self._namespace}_{name}", doc, labels=["domain", "rule"]
            )
            for (domain, label), counts in items:
                family.add_metric([domain, label], getattr(counts, attribute))
            yield family


class LatencyHistogram(Collector):
    """A Prometheus histogram without locks: one bisect and two additions per observation."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self._name, self._doc, self._bounds = name, doc, buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterable[HistogramMetricFamily]:
        cumulative, running = [], 0
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(self._name, self._doc, buckets=cumulative, sum_value=self._sum)
