"""TLS on the gRPC port, as Envoy Gateway sets it up between Envoy and its rate limit service:
mutual TLS works, a client without a certificate is refused, a rotated certificate is served
to the next connection."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.sidecar import SidecarProcess
from harness.xds_certs import SERVER_NAME, Pki, make_pki, signed_cert
from ratelimit_sidecar import wire

pytestmark = pytest.mark.integration

RULE = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SidecarProcess, Pki, Path]]:
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "d.yaml").write_text(RULE)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    node = SidecarProcess(
        tmp_path / "d.yaml",
        *("--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key)),
        *("--grpc-tls-ca-cert", str(pki.ca)),
    )
    try:
        yield node, pki, tmp_path
    finally:
        node.stop()


def secure_channel(node: SidecarProcess, pki: Pki, with_cert: bool = True) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.client_key.read_bytes() if with_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if with_cert else None,
    )
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    return grpc.secure_channel(node.address, credentials, options=options)


def decide(channel: grpc.Channel) -> int:
    reply = rls_stub(channel).ShouldRateLimit(request("d", [("k", "v")]), timeout=5)
    return int(reply.overall_code)


def wait_serving(node: SidecarProcess, pki: Pki) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            with secure_channel(node, pki) as channel:
                decide(channel)
                return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the TLS port did not come up"
            time.sleep(0.1)


def served_name(node: SidecarProcess, pki: Pki) -> str:
    """The common name of the certificate the port presents to a new connection."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(pki.client_cert, pki.client_key)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", node.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls,
    ):
        peer = tls.getpeercert()
    assert peer is not None
    names = [pair[1] for rdn in peer["subject"] for pair in rdn if pair[0] == "commonName"]
    return str(names[0])


def test_mutual_tls_answers_and_a_client_without_a_certificate_is_refused(
    served: tuple[SidecarProcess, Pki, Path],
) -> None:
    node, pki, _ = served
    wait_serving(node, pki)
    with secure_channel(node, pki) as channel:
        assert decide(channel) == wire.Code.OK
    with secure_channel(node, pki, with_cert=False) as channel, pytest.raises(grpc.RpcError):
        decide(channel)
    with grpc.insecure_channel(node.address) as channel, pytest.raises(grpc.RpcError):
        decide(channel)


def test_a_rotated_certificate_is_served_to_the_next_connection(
    served: tuple[SidecarProcess, Pki, Path],
) -> None:
    node, pki, directory = served
    wait_serving(node, pki)
    assert served_name(node, pki) == "server"
    extension = f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth"
    cert, key = signed_cert((pki.ca, pki.ca_key), "server-2", extension)
    for source, target in ((key, directory / "tls.key"), (cert, directory / "tls.crt")):
        shutil.copy(source, directory / "next")
        os.replace(directory / "next", target)
    deadline = time.monotonic() + 5
    while served_name(node, pki) != "server-2":
        assert time.monotonic() < deadline, "the rotated certificate was not served"
        time.sleep(0.1)
    with secure_channel(node, pki) as channel:
        assert decide(channel) == wire.Code.OK
