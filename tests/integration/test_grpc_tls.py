"""TLS and mTLS on the gRPC port of a real sidecar, and certificates rotated on disk."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.net import free_ports
from harness.rules import write_rules
from harness.sidecar import SidecarProcess, run_cli, serve_args
from harness.xds_certs import SERVER_NAME, Pki, client_cert, make_ca, make_pki, signed_cert
from ratelimit_sidecar._proto import wire

NAME_OPTION = (("grpc.ssl_target_name_override", SERVER_NAME),)
SERVER_EXT = f"subjectAltName=IP:127.0.0.1,DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth"


def tls_args(pki: Pki, *, mutual: bool = False) -> list[str]:
    args = ["--grpc-tls-cert", str(pki.server_cert), "--grpc-tls-key", str(pki.server_key)]
    return [*args, "--grpc-tls-client-ca", str(pki.ca)] if mutual else args


def ask(address: str, ca: Path, client: tuple[Path, Path] | None = None) -> int:
    """One ShouldRateLimit over a new TLS channel trusting `ca`; the overall code."""
    key, chain = (
        (None, None) if client is None else (client[1].read_bytes(), client[0].read_bytes())
    )
    creds = grpc.ssl_channel_credentials(ca.read_bytes(), key, chain)
    with grpc.secure_channel(address, creds, options=NAME_OPTION) as channel:
        reply = rls_stub(channel).ShouldRateLimit(request("gateway", [("client", "t")]), timeout=5)
    return int(reply.overall_code)


def refused(address: str, ca: Path, client: tuple[Path, Path] | None = None) -> bool:
    try:
        ask(address, ca, client)
    except grpc.RpcError as exc:
        return exc.code() is grpc.StatusCode.UNAVAILABLE
    return False


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def wait_tls(address: str, ca: Path, client: tuple[Path, Path] | None = None) -> None:
    deadline = time.monotonic() + 15
    while refused(address, ca, client):
        assert time.monotonic() < deadline, "the sidecar never answered over TLS"
        time.sleep(0.1)


@pytest.fixture
def tls_sidecar(tmp_path: Path, pki: Pki) -> Iterator[SidecarProcess]:
    process = SidecarProcess(write_rules(tmp_path), *tls_args(pki))
    try:
        wait_tls(process.address, pki.ca)
        yield process
    finally:
        process.stop()


def test_tls_serves_clients_that_trust_the_ca_and_not_plaintext(
    tls_sidecar: SidecarProcess, pki: Pki
) -> None:
    assert ask(tls_sidecar.address, pki.ca) == wire.Code.OK
    with (
        grpc.insecure_channel(tls_sidecar.address) as channel,
        pytest.raises(grpc.RpcError) as error,
    ):
        rls_stub(channel).ShouldRateLimit(request("gateway", [("client", "p")]), timeout=3)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_a_client_without_a_certificate(tmp_path: Path, pki: Pki) -> None:
    process = SidecarProcess(write_rules(tmp_path), *tls_args(pki, mutual=True))
    client = (pki.client_cert, pki.client_key)
    try:
        wait_tls(process.address, pki.ca, client)
        assert ask(process.address, pki.ca, client) == wire.Code.OK
        assert refused(process.address, pki.ca)  # no certificate
        stranger = client_cert(make_ca(tmp_path / "other", "other-ca"), "stranger")
        assert refused(process.address, pki.ca, stranger)  # not from the trusted CA
    finally:
        process.stop()


def test_a_rotated_certificate_is_served_to_the_next_connection(
    tmp_path: Path, tls_sidecar: SidecarProcess, pki: Pki
) -> None:
    new_ca = make_ca(tmp_path / "rotated", "new-ca")
    cert, key = signed_cert(new_ca, "server", SERVER_EXT)
    creds = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(tls_sidecar.address, creds, options=NAME_OPTION) as kept:
        stub = rls_stub(kept)
        stub.ShouldRateLimit(request("gateway", [("client", "k")]), timeout=5)
        shutil.copyfile(key, pki.server_key)  # what a secret's rotation does
        shutil.copyfile(cert, pki.server_cert)
        wait_tls(tls_sidecar.address, new_ca[0])  # a new connection gets the new certificate
        assert refused(tls_sidecar.address, pki.ca)
        reply = stub.ShouldRateLimit(request("gateway", [("client", "k")]), timeout=5)
        assert reply.overall_code == wire.Code.OK  # the connection in use was kept


def test_a_bad_rotation_keeps_the_last_good_files_and_is_counted(
    tls_sidecar: SidecarProcess, pki: Pki
) -> None:
    pki.server_cert.write_text("not a certificate\n")
    time.sleep(1.5)  # past the recheck interval
    assert ask(tls_sidecar.address, pki.ca) == wire.Code.OK
    import urllib.request

    url = f"http://127.0.0.1:{tls_sidecar.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    assert "ratelimit_sidecar_tls_reload_errors_total 1.0" in text


@pytest.mark.parametrize(
    ("broken", "said"),
    [
        ("missing_cert", "cannot read the TLS certificate"),
        ("garbage_key", "holds no PEM key"),
        ("other_key", "does not match"),
    ],
)
def test_a_bad_file_at_start_exits_1_naming_it(
    tmp_path: Path, pki: Pki, broken: str, said: str
) -> None:
    cert, key = pki.server_cert, pki.server_key
    if broken == "missing_cert":
        cert = tmp_path / "nowhere.pem"
    elif broken == "garbage_key":
        key.write_text("garbage\n")
    else:
        key = pki.client_key
    config = write_rules(tmp_path)
    grpc_port, metrics_port = free_ports(2)
    args = serve_args(config, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}")
    result = run_cli([*args, "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key)])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0]
    assert str(cert if broken == "missing_cert" else key) in lines[0]


def test_a_required_san_refuses_client_certificates_without_it(tmp_path: Path, pki: Pki) -> None:
    named = signed_cert(
        (pki.ca, pki.ca_key),
        "named",
        "subjectAltName=DNS:envoy-gateway\nextendedKeyUsage=clientAuth",
    )
    args = [*tls_args(pki, mutual=True), "--grpc-tls-client-san", "envoy-gateway"]
    process = SidecarProcess(write_rules(tmp_path), *args)
    try:
        wait_tls(process.address, pki.ca, named)
        assert ask(process.address, pki.ca, named) == wire.Code.OK
        with pytest.raises(grpc.RpcError):  # closed after the handshake: no such SAN
            ask(process.address, pki.ca, (pki.client_cert, pki.client_key))
    finally:
        process.stop()
    assert "a TLS client without the required SAN envoy-gateway" in process.stderr
