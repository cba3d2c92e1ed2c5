"""Prometheus metrics of one sidecar, on an injectable registry (tests pass their own).

Decision metrics are labelled by domain and rule id (bounded by the config), never by raw
descriptor values unless the rule has `detailed_metric` or `value_to_metric` (metriclabels.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ratelimit_sidecar.core import Decision, FleetLimiter, Hit, Limiter, SyncStats, Verdict
from ratelimit_sidecar.core.keystate import Bucket, KeyState, WindowCounts
from ratelimit_sidecar.core.quiet_keys import read_again_asked
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.types import OVER_LIMIT
from ratelimit_sidecar.metrics.grpc_port import GrpcPortCollector
from ratelimit_sidecar.metrics.hot import DecisionCounts, LatencyHistogram, Tally
from ratelimit_sidecar.metrics.labels import NS, RuleLabels
from ratelimit_sidecar.metrics.penalty import PenaltyCollector

LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
STRICT_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
STRICT_RESULTS = ("admitted", "over_limit", "failed", "breaker_open")  # = service.strict's
PROPAGATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SYNC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


ERROR_KINDS = ("timeout", "connection", "refused", "other")  # = StoreError.kind values
MAX_SHARED_TALLIES = 10_000  # distinct label combinations kept for sharing


class Metrics:
    """Every metric the sidecar exports; also the service's DecisionObserver."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._decision_metrics()
        self._sync_metrics()
        self._config_metrics()
        self._strict_metrics()
        self._override_metrics()
        self.admin_requests = self._counter(
            "admin_requests", "Admin API requests by status code", ("code",)
        )
        self._labels = RuleLabels(lambda rule_id: self.value_label_overflow.labels(rule_id).inc())
        for kind in ERROR_KINDS:  # export zeros, so rate() and alerts work before a failure
            self.sync_errors.labels(kind)
        self._version = ""
        self._tallies: dict[tuple[str, tuple[str | None, ...]], Tally] = {}

    def _counter(self, name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"{NS}_{name}", text, labels, registry=self.registry)

    def _gauge(self, name: str, text: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(f"{NS}_{name}", text, labels, registry=self.registry)

    def _histogram(self, name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"{NS}_{name}", text, buckets=buckets, registry=self.registry)

    def _decision_metrics(self) -> None:
        self.decisions = DecisionCounts(NS)
        self.decision_seconds = LatencyHistogram(
            f"{NS}_decision_seconds",
            "Time to decide one request, of one request in 16 (the others are not timed)",
            LATENCY_BUCKETS,
        )
        self.registry.register(self.decisions)
        self.registry.register(self.decision_seconds)
        self.unknown_domains = self._counter(
            "unknown_domain", "Requests for a domain with no rules"
        )

    def _sync_metrics(self) -> None:
        self.sync_seconds = self._histogram(
            "sync_seconds", "Duration of one span sync", SYNC_BUCKETS
        )
        self.sync_errors = self._counter("sync_errors", "Failed syncs by error kind", ("kind",))
        self.sync_key_errors = self._counter(
            "sync_key_errors",
            "Keys the store answered in a sync but did not apply (kept for the next sync)",
        )
        self.heartbeat_errors = self._counter(
            "heartbeat_errors", "Heartbeats the store refused (live node count stale)"
        )
        self.sync_round_trips = self._counter("sync_round_trips", "Store round trips")
        self.keys_pushed = self._counter("sync_keys_pushed", "Counter deltas pushed")
        self.keys_read = self._counter("sync_keys_read", "Window totals read without a push")
        self.edge_pushes = self._counter(
            "edge_pushes", "Deltas pushed of keys at the edge, within sync_keys_pushed"
        )
        self.dropped_hits = self._counter(
            "dropped_hits", "Admitted hits never confirmed by the store"
        )

    def _config_metrics(self) -> None:
        self.config_loads = self._counter("config_loads", "Rule loads by result", ("result",))
        self.config_load_errors = self._counter("config_load_errors", "Rule loads that failed")
        self.config_version = self._gauge(
            "config_version_info", "Loaded rules version", ("version",)
        )
        self.value_label_overflow = self._counter(
            "value_label_overflow",
            "Distinct requests counted under the rule id: value_to_metric labels were used up",
            ("rule",),
        )

    def _strict_metrics(self) -> None:
        self.strict_checks = self._counter(
            "strict_checks",
            "Requests' strict checks by result (breaker_open: Redis not called)",
            ("result",),
        )
        self.strict_check_seconds = self._histogram(
            "strict_check_seconds",
            "Duration of one request's strict check on Redis (failures included)",
            STRICT_BUCKETS,
        )
        self.strict_breaker_state = self._gauge(
            "strict_breaker_state",
            "Circuit breaker of strict checks: 0 closed, 1 open, 2 half-open (one probe)",
        )
        for result in STRICT_RESULTS:
            self.strict_checks.labels(result)

    def _override_metrics(self) -> None:
        self.overrides_in_force = self._gauge(
            "overrides_in_force", "Runtime overrides applied now (expired ones not)"
        )
        self.overrides_version = self._gauge(
            "overrides_version", "Version of the override set applied"
        )
        self.overrides_propagation_seconds = self._histogram(
            "overrides_propagation_seconds",
            "From an override write to its set applied on this node",
            PROPAGATION_BUCKETS,
        )
        self.tls_reload_errors = self._counter(
            "tls_reload_errors",
            "Rotated TLS files that could not be used (the last good ones kept serving)",
        )

    # -- DecisionObserver ---------------------------------------------------------------

    def tally(self, domain: str, hits: Sequence[Hit]) -> Tally:
        """Each hit's decision counters, looked up once per distinct request (see decided).

        Requests that count against the same rules share one tally: it is kept with every
        compiled request, so sharing it saves memory per tracked key.
        """
        label = self._labels.label
        labels = tuple(
            None if hit.rule is None or hit.rule.limit is None else label(hit.rule, hit.key)
            for hit in hits
        )
        found = self._tallies.get((domain, labels))
        if found is None:
            if len(self._tallies) >= MAX_SHARED_TALLIES:
                self._tallies.clear()
            counts = self.decisions.counts
            found = tuple(None if label is None else counts(domain, label) for label in labels)
            self._tallies[(domain, labels)] = found
        return found

    def decided(self, tally: Tally, decision: Decision) -> None:
        for counts, verdict in zip(tally, decision.verdicts, strict=True):
            if counts is None:
                continue
            counts.total += 1
            if verdict.code is OVER_LIMIT:
                counts.over += 1
            elif verdict.shadow_refused:
                counts.shadow += 1
            else:
                counts.within += 1
                counts.near += verdict.near_limit

    def admitted(self, tally: Tally, index: int, verdict: Verdict) -> None:
        counts = tally[index]
        if counts is not None:
            counts.total += 1
            counts.within += 1
            if verdict.near_limit:
                counts.near += 1

    def unknown_domain(self, domain: str) -> None:  # noqa: ARG002 - one counter, no raw labels
        self.unknown_domains.inc()

    # -- strict checks ------------------------------------------------------------------

    def strict_checked(self, result: str, seconds: float) -> None:
        self.strict_checks.labels(result).inc()
        if result != "breaker_open":  # no call made: nothing to time
            self.strict_check_seconds.observe(seconds)

    def watch_breaker(self, state: Callable[[], int]) -> None:
        self.strict_breaker_state.set_function(lambda: float(state()))

    def watch_grpc_port(
        self, trips: Callable[[], dict[str, int]], pending: Callable[[], int]
    ) -> None:
        self.registry.register(GrpcPortCollector(trips, pending))

    # -- sync and config ----------------------------------------------------------------

    def synced(self, stats: SyncStats, seconds: float, error_kind: str) -> None:
        self.sync_seconds.observe(seconds)
        self.sync_round_trips.inc()
        self.keys_pushed.inc(stats.pushed_keys)
        self.keys_read.inc(stats.read_keys)
        self.edge_pushes.inc(stats.edge_pushes)
        self.dropped_hits.inc(stats.dropped_hits)
        self.sync_key_errors.inc(stats.failed_keys)
        if stats.heartbeat_failed:
            self.heartbeat_errors.inc()
        if stats.failed:
            self.sync_errors.labels(error_kind if error_kind in ERROR_KINDS else "other").inc()

    def config_loaded(self, ok: bool, version: str = "") -> None:
        self.config_loads.labels("success" if ok else "failure").inc()
        if not ok:
            self.config_load_errors.inc()
            return
        if self._version:
            self.config_version.remove(self._version)
        self.config_version.labels(version).set(1)
        self._version = version

    def watch(
        self, limiter: Limiter, store_up: Callable[[], bool], now_ms: Callable[[], int]
    ) -> None:
        """Register gauges computed at scrape time from the limiter's state."""
        self.registry.register(StateCollector(limiter, store_up, now_ms))
        self.registry.register(PenaltyCollector(limiter, now_ms))


def _at_edge(state: KeyState, now_ms: int) -> bool:
    """In its current window: a key's counts roll to the next window only at its next use. A
    sliding window or bucket: its span's first answer found it within reach of MAX."""
    counts = state.counts
    if isinstance(counts, SpanState | Bucket):
        return read_again_asked(state, counts, now_ms)
    current = state.window == now_ms // state.limit.window_ms
    return isinstance(counts, WindowCounts) and counts.edge and current


class StateCollector(Collector):
    """Tracked/blocked keys, store state and the nodes estimate per rule, read at scrape time."""

    def __init__(
        self, limiter: Limiter, store_up: Callable[[], bool], now_ms: Callable[[], int]
    ) -> None:
        self._limiter, self._store_up, self._now_ms = limiter, store_up, now_ms

    def collect(self) -> Iterable[GaugeMetricFamily]:
        limiter, up = self._limiter, self._store_up()
        yield GaugeMetricFamily(f"{NS}_tracked_keys", "Counters in memory", value=len(limiter.keys))
        yield GaugeMetricFamily(
            f"{NS}_blocked_keys", "Counters blocked now", value=limiter.blocked_keys(self._now_ms())
        )
        # Up while the store answers syncs, even when it refused some keys in them (those are
        # counted in sync_key_errors): one bad key must not make the whole node look down.
        yield GaugeMetricFamily(f"{NS}_redis_up", "Last sync reached the store", value=int(up))
        yield GaugeMetricFamily(
            f"{NS}_fallback_active", "Deciding on local thresholds", value=int(not up)
        )
        yield GaugeMetricFamily(
            f"{NS}_untracked_decisions",
            "Decided without tracking (table full)",
            value=limiter.untracked,
        )
        yield GaugeMetricFamily(
            f"{NS}_live_nodes", "Nodes the store's heartbeats counted", value=limiter.live_nodes
        )
        quiet = limiter.quiet.hits if isinstance(limiter, FleetLimiter) else 0
        now_ms = self._now_ms()
        yield GaugeMetricFamily(
            f"{NS}_edge_keys",
            "Counters whose window is at the edge: pushed within milliseconds",
            value=sum(1 for state in limiter.keys if _at_edge(state, now_ms)),
        )
        yield GaugeMetricFamily(
            f"{NS}_quiet_hits", "Hits of quiet keys never sent to the store", value=quiet
        )
        yield self._nodes()  # fmt: skip

    def _nodes(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            f"{NS}_nodes_estimate", "Nodes sharing a rule's counters", labels=["rule", "stat"]
        )
        per_rule: dict[str, list[float]] = {}
        for state in self._limiter.keys:
            per_rule.setdefault(state.rule.id, []).append(state.nodes.value)
        for rule_id, values in per_rule.items():
            family.add_metric([rule_id, "min"], min(values))
            family.add_metric([rule_id, "avg"], sum(values) / len(values))
            family.add_metric([rule_id, "max"], max(values))
        return family  # fmt: skip
