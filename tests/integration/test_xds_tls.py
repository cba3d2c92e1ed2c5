"""mTLS to the xDS control plane: a trusted server works, rotated client files are used at
once, and a server the configured CA did not sign is refused with a clear log line."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.net import free_ports, http_ok, wait_grpc_serving
from harness.process import stop_process
from harness.sidecar import SidecarProcess, start_reference
from harness.xds_certs import SERVER_NAME, Pki, client_cert, make_pki
from harness.xds_server import AdsServer, ServerTls, gateway_config
from tests.integration.test_xds import RETRY, get, limit_at, limit_seen, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def ads(pki: Pki) -> Iterator[AdsServer]:
    server = AdsServer(ServerTls(pki.server_cert, pki.server_key, pki.ca)).start()
    server.push([gateway_config(8)], "t1")
    try:
        yield server
    finally:
        server.stop()


def tls_sidecar(ads: AdsServer, cert: Path, key: Path, ca: Path) -> SidecarProcess:
    return SidecarProcess(
        None,
        *("--config-xds", ads.address, "--config-xds-client-tls", *RETRY),
        *("--config-xds-client-tls-cert", str(cert), "--config-xds-client-tls-key", str(key)),
        *("--config-xds-server-tls-cacert", str(ca), "--config-xds-server-tls-san", SERVER_NAME),
    ).wait_ready()


def test_mtls_works_and_rotated_client_files_are_used_at_once(
    ads: AdsServer, pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.client_cert, cert)
    shutil.copy(pki.client_key, key)
    node = tls_sidecar(ads, cert, key, pki.ca)
    try:
        wait_for(lambda: limit_seen(node) == 8, 3.0)
        assert "client" in ads.peers  # the server saw our client certificate
        rotated_cert, rotated_key = client_cert((pki.ca, pki.ca_key), "client-2")
        for source, target in ((rotated_key, key), (rotated_cert, cert)):
            shutil.copy(source, tmp_path / "next")
            os.replace(tmp_path / "next", target)  # as a Secret update swaps files whole
        wait_for(lambda: "client-2" in ads.peers, 5.0)
        ads.push([gateway_config(5)], "t2")
        wait_for(lambda: limit_seen(node) == 5, 3.0)
    finally:
        node.stop()


def test_a_control_plane_the_ca_did_not_sign_is_refused_with_a_clear_log_line(
    ads: AdsServer, pki: Pki, tmp_path: Path
) -> None:
    other = make_pki(tmp_path / "other", "other-ca")
    node = tls_sidecar(ads, pki.client_cert, pki.client_key, other.ca)
    try:
        wait_for(lambda: node.metric("xds_connect_attempts_total") >= 2, 5.0)
        status, body = get(node, "/readyz")
        assert status == 503 and body["ready"] is False
        assert limit_seen(node) == 0  # no rules: nothing matches
    finally:
        node.stop()
    assert "TLS handshake failed" in node.stderr
    assert "CONFIG_GRPC_XDS_SERVER_TLS_CACERT" in node.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in node.stderr


def test_the_ratelimit_command_with_envoy_gateways_variables(
    ads: AdsServer, pki: Pki, tmp_path: Path
) -> None:
    """What Envoy Gateway's Deployment sets (local ports and files instead of its own)."""
    port, grpc_port = free_ports(2)
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": ads.address,
        "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": str(pki.client_cert),
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": str(pki.client_key),
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": str(pki.ca),
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN": SERVER_NAME,
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "200ms",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1s",
        "HOST": "127.0.0.1", "PORT": str(port), "GRPC_HOST": "127.0.0.1",
        "GRPC_PORT": str(grpc_port), "RUNTIME_ROOT": str(tmp_path), "LOG_LEVEL": "info",
    }  # fmt: skip
    proc = start_reference(env)
    try:
        target = f"127.0.0.1:{grpc_port}"
        wait_grpc_serving(target)
        ads.push([gateway_config(7)], "eg1")
        wait_for(lambda: limit_at(target) == 7, 3.0)
        assert http_ok(f"http://127.0.0.1:{port}/healthcheck")  # the reference's probe port
    finally:
        _, stderr = stop_process(proc)
    assert "xDS version 'eg1' accepted (ACK)" in stderr
