"""Every metric the Grafana dashboard queries is one the sidecar exports."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

DASHBOARD = Path(__file__).parents[2] / "envoy" / "monitoring" / "grafana-dashboard.json"
METRIC = re.compile(r"\bratelimit_sidecar_[a-z_]+")


def dashboard_metrics() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {m for p in panels for t in p["targets"] for m in METRIC.findall(t["expr"])}


@pytest.fixture
async def exported(tmp_path: Path) -> AsyncIterator[set[str]]:
    settings = Settings(
        config_path=str(tmp_path), grpc_address="127.0.0.1:0", metrics_address="127.0.0.1:0"
    )
    sidecar = Sidecar(settings, load_rules(write_rules(tmp_path)))
    await sidecar.startup()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        stub = rls_stub(channel)
        for _ in range(5):  # so labelled series exist
            await stub.ShouldRateLimit(request("gateway", [("client", "d")]))
    names: set[str] = set()
    for family in sidecar.metrics.registry.collect():
        names.update(sample.name for sample in family.samples)
    yield names
    await sidecar.shutdown()


def test_dashboard_has_queries() -> None:
    assert len(dashboard_metrics()) >= 15


async def test_every_dashboard_metric_is_exported(exported: set[str]) -> None:
    missing = dashboard_metrics() - exported
    assert not missing, f"dashboard queries metrics the sidecar does not export: {missing}"
