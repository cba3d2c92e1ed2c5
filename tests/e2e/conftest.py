"""Real Envoy + real sidecars (+ real Redis) for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.envoy import EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

RULES = Path(__file__).parent / "rules"


@dataclass
class Gateway:
    sidecar: SidecarProcess
    envoy: EnvoyProcess

    @property
    def url(self) -> str:
        return self.envoy.url


def start_gateway(workdir: Path, name: str, *flags: str) -> Gateway:
    sidecar = SidecarProcess(RULES, "--node-id", name, *flags).wait_ready()
    try:
        envoy = EnvoyProcess(workdir, sidecar.port, name).wait_ready()
    except Exception:
        sidecar.stop()
        raise
    return Gateway(sidecar, envoy)


def stop_gateway(gateway: Gateway) -> None:
    gateway.envoy.stop()
    gateway.sidecar.stop()


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    """Two gateways, each Envoy with its own sidecar, sharing one Redis."""
    workdir = tmp_path_factory.mktemp("pair")
    group = ServerGroup(workdir / "redis")
    gateways: list[Gateway] = []
    try:
        redis = group.standalone()
        for name in ("gw-a", "gw-b"):
            gateways.append(start_gateway(workdir, name, "--redis-url", redis.url))
        yield gateways
    finally:
        for gateway in gateways:
            stop_gateway(gateway)
        group.stop_all()


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway with a local-only sidecar and IETF headers on: exact counts."""
    gateway = start_gateway(tmp_path_factory.mktemp("single"), "solo", "--ietf-headers")
    try:
        yield gateway
    finally:
        stop_gateway(gateway)
