"""A real Envoy in front of a sidecar whose rules come from xDS: one push lowers a limit, and
the next window's requests are refused at the new limit."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.envoy import EnvoyProcess
from harness.sidecar import SidecarProcess
from harness.xds_server import AdsServer
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls
from tests.e2e.test_envoy import get, wait_for_window_start

pytestmark = pytest.mark.e2e


def per_key_limit(limit: int) -> rls.RateLimitConfig:
    """`limit` a second per API key (Envoy's `api_key` descriptor), domain gateway."""
    policy = rls.RateLimitPolicy(unit=rls.SECOND, requests_per_unit=limit)
    key = rls.RateLimitDescriptor(key="api_key", rate_limit=policy)
    return rls.RateLimitConfig(name="gateway", domain="gateway", descriptors=[key])


@pytest.fixture
def xds_gateway(tmp_path: Path) -> Iterator[tuple[AdsServer, SidecarProcess, EnvoyProcess]]:
    ads = AdsServer().start()
    ads.push([per_key_limit(5)], "e1")
    sidecar = SidecarProcess(None, "--config-xds", ads.address, "--node-id", "xds-e2e")
    try:
        sidecar.wait_ready()
        envoy = EnvoyProcess(tmp_path, sidecar.port, "xds-e2e").wait_ready()
        try:
            yield ads, sidecar, envoy
        finally:
            envoy.stop()
    finally:
        sidecar.stop()
        ads.stop()


def accepted_version(sidecar: SidecarProcess) -> str:
    url = f"http://127.0.0.1:{sidecar.metrics_port}/debug/rules"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(json.loads(reply.read())["source"]["accepted_version"])


def wait_for_version(sidecar: SidecarProcess, version: str) -> None:
    deadline = time.monotonic() + 2.0
    while accepted_version(sidecar) != version:
        assert time.monotonic() < deadline, f"version {version} not accepted within 2 s"
        time.sleep(0.02)


def one_window(envoy: EnvoyProcess, api_key: str, count: int) -> list[int]:
    """`count` requests as a fresh API key, inside one one-second window. A burst that a loaded
    machine stretched past the window's end is sent again (at most 3 times) with another key."""
    for attempt in range(3):
        wait_for_window_start(1)
        started = time.time()
        statuses = [get(envoy.url, x_api_key=f"{api_key}-{attempt}").status for _ in range(count)]
        if int(time.time()) == int(started):
            return statuses
    raise AssertionError("no burst fitted in one second")


def test_a_push_that_lowers_a_limit_refuses_the_next_window_at_the_new_limit(
    xds_gateway: tuple[AdsServer, SidecarProcess, EnvoyProcess],
) -> None:
    ads, sidecar, envoy = xds_gateway
    wait_for_version(sidecar, "e1")
    assert one_window(envoy, "before", 7) == [200] * 5 + [429] * 2
    ads.push([per_key_limit(2)], "e2")
    wait_for_version(sidecar, "e2")
    assert one_window(envoy, "after", 5) == [200] * 2 + [429] * 3
    acks = ads.answers_to("e2")
    assert [(a.version_info, a.HasField("error_detail")) for a in acks] == [("e2", False)]
