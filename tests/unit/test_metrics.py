"""The `rule` label of the decision counters: rule ids, detailed_metric and value_to_metric."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config import RuleSet, load_rules, match
from ratelimit_sidecar.core import Code, Decision, Hit, PushResult, SyncStats, Verdict
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.metrics.labels import MAX_VALUE_LABELS
from tests.unit.core.test_edge_trailing import BUCKET, T0, send, sync
from tests.unit.core.test_edge_trailing import fleet as trailing_fleet

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = Path(__file__).parent / "config" / "fixtures" / "reference"
Entries = list[tuple[str, str]]


def count(metrics: Metrics, rules: RuleSet, domain: str, entries: Entries) -> None:
    """One decided request with one descriptor, as the service reports it."""
    loaded = rules.domain(domain)
    assert loaded is not None
    rule = match(loaded, entries)
    assert rule is not None, entries
    key = (domain, *(part for entry in entries for part in entry))
    tally = metrics.tally(domain, [Hit(rule, key, 1)])
    metrics.decided(tally, Decision(Code.OK, (Verdict(Code.OK),)))


def counted_labels(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["rule"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "ratelimit_sidecar_total_hits"
        for sample in family.samples
    }


@pytest.mark.parametrize(
    ("entries", "label"),
    [
        ([("tenant", "acme"), ("verb", "GET"), ("user", "u1")], "shop.tenant_acme.verb_GET.user"),
        ([("tenant", ""), ("verb", "PUT"), ("user", "u1")], "shop.tenant.verb_PUT.user"),
        ([("region", "eu"), ("zone", "z1"), ("host", "h1")], "shop.region.zone_z1.host"),
        ([("plan", "gold"), ("verb", "GET")], "shop.plan_gold.verb_GET"),
        ([("path", "/api/v1/users")], "shop.path_/api/v1/users"),
        ([("file", "img7")], "shop.file_img*"),
        ([("bucket", "b42"), ("op", "put")], "shop.bucket_b*.op_put"),
        ([("team", "red"), ("member", "ann")], "shop.team.member|team.red.member.ann"),
        ([("client", "c1")], "shop.client"),
    ],
)
def test_value_to_metric_names_the_flagged_levels(entries: Entries, label: str) -> None:
    metrics = Metrics()
    count(metrics, load_rules(FIXTURES / "value_to_metric.yaml"), "shop", entries)
    assert counted_labels(metrics) == {label: 1.0}


@pytest.mark.parametrize(
    ("entries", "label"),
    [
        ([("route", "api/v1"), ("method", "GET")], "test-domain.route_api/*.method"),
        ([("midroute", "/api/x/v2")], "test-domain.midroute_/api*v2"),
    ],
)
def test_share_threshold_keeps_the_pattern_in_the_reference_fixture(
    entries: Entries, label: str
) -> None:
    metrics = Metrics()
    count(metrics, load_rules(REFERENCE / "share_threshold.yaml"), "test-domain", entries)
    assert counted_labels(metrics) == {label: 1.0}


def test_distinct_values_per_rule_are_bounded() -> None:
    metrics, rules = Metrics(), load_rules(FIXTURES / "value_to_metric.yaml")
    for index in range(MAX_VALUE_LABELS + 5):
        count(metrics, rules, "shop", [("path", f"/api/{index}")])
    count(metrics, rules, "shop", [("path", "/api/0")])  # an early value keeps its label
    counted = counted_labels(metrics)
    assert len(counted) == MAX_VALUE_LABELS + 1
    assert counted["shop.path_/api/0"] == 2
    assert counted["shop.path_/api/*"] == 5  # the rule id takes the rest
    overflow = metrics.registry.get_sample_value(
        "ratelimit_sidecar_value_label_overflow_total", {"rule": "shop.path_/api/*"}
    )
    assert overflow == 5


def test_the_bound_is_per_rule() -> None:
    metrics, rules = Metrics(), load_rules(FIXTURES / "value_to_metric.yaml")
    for index in range(MAX_VALUE_LABELS):
        count(metrics, rules, "shop", [("path", f"/api/{index}")])
    count(metrics, rules, "shop", [("plan", "free"), ("verb", "GET")])
    assert "shop.plan_free.verb_GET" in counted_labels(metrics)


def test_keys_the_store_did_not_apply_are_counted_and_redis_stays_up() -> None:
    metrics = Metrics()
    metrics.synced(SyncStats(pushed_keys=8, failed_keys=2), 0.01, "")
    metrics.synced(SyncStats(pushed_keys=10, failed_keys=0), 0.01, "")
    metrics.synced(SyncStats(failed=True), 0.01, "timeout")
    sample = metrics.registry.get_sample_value
    assert sample("ratelimit_sidecar_sync_key_errors_total") == 2
    assert sample("ratelimit_sidecar_sync_errors_total", {"kind": "timeout"}) == 1
    assert sample("ratelimit_sidecar_sync_errors_total", {"kind": "refused"}) == 0


def test_a_trailing_key_asked_to_read_again_shows_in_edge_keys() -> None:
    limiter = trailing_fleet()
    metrics = Metrics()
    now = {"ms": T0 + 500}
    metrics.watch(limiter, lambda: True, lambda: now["ms"])
    send(limiter, BUCKET, T0 + 450, 150)
    sync(limiter, T0 + 500, PushResult(150, 0))
    assert metrics.registry.get_sample_value("ratelimit_sidecar_edge_keys") == 1
    now["ms"] = T0 + 1000  # the next span: its first answer decides again
    assert metrics.registry.get_sample_value("ratelimit_sidecar_edge_keys") == 0
