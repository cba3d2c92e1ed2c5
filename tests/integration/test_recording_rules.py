"""The recording rules that give our metrics the reference service's names: every expression
reads metrics the sidecar exports, every name a reference dashboard reads per rule is recorded,
and the `key1`/`key2` labels cut from our `rule` label are the reference's stats key levels."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

MONITORING = Path(__file__).parents[2] / "envoy" / "monitoring"
RULES_FILE = MONITORING / "reference-names.rules.yml"
METRIC = re.compile(r"\bratelimit_sidecar_[a-z_]+")
# label_replace(<vector>, "dst", "replacement", "src", "regex"): the ones reading `rule`
LABEL_FROM_RULE = re.compile(r'"(key[12])", "\$1", "rule", "([^"]+)"')
# The per-rule names of the reference's Prometheus mapper (its default_mapper.yaml).
REFERENCE_PER_RULE = {
    f"ratelimit_service_rate_limit_{stat}"
    for stat in ("total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode")
}


def recording_rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


@pytest.fixture
async def exported(tmp_path: Path) -> AsyncIterator[dict[str, list[dict[str, str]]]]:
    """Sample name -> the label sets exported under it, after one and two level rules decided."""
    settings = Settings(
        config_path=str(tmp_path), grpc_address="127.0.0.1:0", metrics_address="127.0.0.1:0"
    )
    sidecar = Sidecar(settings, load_rules(write_rules(tmp_path)))
    await sidecar.startup()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        stub = rls_stub(channel)
        for _ in range(5):
            await stub.ShouldRateLimit(request("gateway", [("client", "d")]))
            await stub.ShouldRateLimit(
                request("gateway", [("api_key", "k"), ("path", "/v1/orders")])
            )
    samples: dict[str, list[dict[str, str]]] = {}
    for family in sidecar.metrics.registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    yield samples
    await sidecar.shutdown()


def test_the_rules_record_every_per_rule_name_of_the_reference() -> None:
    recorded = {rule["record"] for rule in recording_rules()}
    assert recorded >= REFERENCE_PER_RULE
    assert {"ratelimit_service_total_requests", "ratelimit_service_config_load_error"} <= recorded


async def test_every_expression_reads_an_exported_metric(
    exported: dict[str, list[dict[str, str]]],
) -> None:
    for rule in recording_rules():
        names = set(METRIC.findall(rule["expr"]))
        assert names, f"{rule['record']} reads none of our metrics"
        missing = names - set(exported)
        assert not missing, f"{rule['record']} reads metrics the sidecar does not export: {missing}"


async def test_key_labels_are_the_first_two_levels_of_the_rule_label(
    exported: dict[str, list[dict[str, str]]],
) -> None:
    rules = {label["rule"] for label in exported["ratelimit_sidecar_total_hits_total"]}
    assert rules == {"gateway.client", "gateway.api_key.path_/v1/orders"}
    [over] = [r for r in recording_rules() if r["record"].endswith("rate_limit_over_limit")]
    patterns = dict(LABEL_FROM_RULE.findall(over["expr"]))

    def labels(rule: str) -> dict[str, str]:  # Prometheus anchors its regular expressions
        found = {dst: re.fullmatch(p, rule) for dst, p in patterns.items()}
        return {dst: match[1] for dst, match in found.items() if match}

    assert labels("gateway.client") == {"key1": "client"}
    assert labels("gateway.api_key.path_/v1/orders") == {
        "key1": "api_key",
        "key2": "path_/v1/orders",
    }
    assert labels("gateway.user|user.alice") == {"key1": "user"}  # detailed_metric


def test_the_scrape_config_loads_the_rules() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert RULES_FILE.name in config["rule_files"]
