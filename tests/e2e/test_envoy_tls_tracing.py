"""A real Envoy reaching the sidecar over TLS and mTLS, and its traces continued by the sidecar."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from harness.envoy import EnvoyProcess, Tune
from harness.envoy_tune import otlp_tracing, sidecar_tls
from harness.otlp import OtlpReceiver
from harness.sidecar import SidecarProcess
from harness.xds_certs import SERVER_NAME, Pki, make_pki
from tests.e2e.conftest import RULES
from tests.e2e.test_envoy import get

pytestmark = pytest.mark.e2e


def gateway(workdir: Path, sidecar: SidecarProcess, tune: Tune) -> EnvoyProcess:
    """An Envoy in front of `sidecar`, once the sidecar's gRPC port is open."""
    deadline = time.monotonic() + 15
    while not port_open(sidecar.port):
        assert time.monotonic() < deadline, f"sidecar did not start: {sidecar.stop()}"
        time.sleep(0.05)
    return EnvoyProcess(workdir, sidecar.port, "tls", tune=tune).wait_ready()


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def server_tls(pki: Pki, *, mutual: bool) -> list[str]:
    args = ["--grpc-tls-cert", str(pki.server_cert), "--grpc-tls-key", str(pki.server_key)]
    return [*args, "--grpc-tls-client-ca", str(pki.ca)] if mutual else args


def decided_by_the_sidecar(envoy: EnvoyProcess) -> bool:
    """The banned key's limit is 0: 429 only when the call reached the sidecar (Envoy fails
    open, 200, when it cannot)."""
    return get(envoy.url, x_api_key="banned").status == 429


@pytest.mark.parametrize("mutual", [False, True])
def test_envoy_reaches_the_sidecar_over_tls(tmp_path: Path, mutual: bool) -> None:
    pki = make_pki(tmp_path / "pki")
    sidecar = SidecarProcess(RULES, *server_tls(pki, mutual=mutual))
    client = (pki.client_cert, pki.client_key) if mutual else None
    try:
        envoy = gateway(tmp_path, sidecar, sidecar_tls(pki.ca, SERVER_NAME, client))
        try:
            assert all(decided_by_the_sidecar(envoy) for _ in range(3))
            assert envoy.stat("cluster.ratelimit_sidecar.ssl.handshake") >= 1
        finally:
            envoy.stop()
    finally:
        sidecar.stop()


def test_mtls_refuses_an_envoy_without_a_client_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    sidecar = SidecarProcess(RULES, *server_tls(pki, mutual=True))
    try:
        envoy = gateway(tmp_path, sidecar, sidecar_tls(pki.ca, SERVER_NAME))
        try:
            assert not any(decided_by_the_sidecar(envoy) for _ in range(3))  # failed open
            assert envoy.stat("cluster.ratelimit_sidecar.ssl.handshake") == 0
            assert envoy.stat("cluster.ratelimit_sidecar.upstream_cx_connect_fail") >= 1
        finally:
            envoy.stop()
    finally:
        sidecar.stop()


def test_the_sidecars_span_is_a_child_of_envoys_call(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        port = int(receiver.grpc_endpoint.rpartition(":")[2])
        tracing = ["--tracing", "--tracing-endpoint", receiver.grpc_endpoint]
        sidecar = SidecarProcess(RULES, *tracing, env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
        sidecar.wait_ready()
        try:
            envoy = gateway(tmp_path, sidecar, otlp_tracing(port))
            try:
                assert decided_by_the_sidecar(envoy)
                ours = receiver.wait_for("ShouldRateLimit")[0]
                envoys = receiver.wait_for(
                    None, lambda s: s.trace_id == ours.trace_id and s.name != ours.name
                )
            finally:
                envoy.stop()  # flushes Envoy's spans too
        finally:
            sidecar.stop()
    # Envoy's egress span of the rate limit call is the sidecar span's parent
    assert ours.parent_span_id in {span.span_id for span in envoys}, (ours, receiver.spans)
