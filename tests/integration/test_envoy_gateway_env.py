"""The `ratelimit` command started with only the environment of Envoy Gateway's rate limit
Deployment (deploy/envoy-gateway/ratelimit-deployment.yaml), its hosts, ports and files made
local: rules over mTLS xDS, the gRPC port over TLS, counts in the Redis it names, and the
reference's endpoints."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.grpc_client import request, rls_stub
from harness.net import free_ports, http_call
from harness.process import stop_process
from harness.redis_servers import ServerProcess
from harness.sidecar import start_reference
from harness.xds_certs import SERVER_NAME, make_ca, signed_cert
from harness.xds_server import GATEWAY_DOMAIN, GATEWAY_PREFIX, AdsServer, ServerTls, gateway_config
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "envoy-gateway"
# certgen's one certificate serves both ways: the gRPC port's and the client's to xDS
BOTH_WAYS = f"subjectAltName=IP:127.0.0.1,DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth,clientAuth"


def manifest_env() -> dict[str, str]:
    deployment = yaml.safe_load((MANIFEST / "ratelimit-deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container["env"]}


class Deployment:
    """The manifest's environment with local stand-ins; the `ratelimit` command running it."""

    def __init__(self, tmp_path: Path, ads: AdsServer, redis: ServerProcess, certs: Path) -> None:
        self.port, self.grpc_port, self.debug_port = free_ports(3)
        local = {
            "/certs/tls.crt": str(certs / "tls.pem"),
            "/certs/tls.key": str(certs / "tls.key"),
            "/certs/ca.crt": str(certs / "ca.pem"),
            "envoy-gateway:18001": ads.address,
            "redis.redis-system.svc.cluster.local:6379": f"127.0.0.1:{redis.port}",
            "/data": str(tmp_path),
        }
        env = {name: local.get(value, value) for name, value in manifest_env().items()}
        env |= {"HOST": "127.0.0.1", "PORT": str(self.port), "GRPC_HOST": "127.0.0.1",
                "GRPC_PORT": str(self.grpc_port), "DEBUG_PORT": str(self.debug_port)}  # fmt: skip
        self.proc = start_reference(env)
        ca = (certs / "ca.pem").read_bytes()
        self.channel = grpc.secure_channel(
            f"127.0.0.1:{self.grpc_port}",
            grpc.ssl_channel_credentials(ca),
            options=(("grpc.ssl_target_name_override", SERVER_NAME),),
        )

    def stop(self) -> str:
        self.channel.close()
        _, err = stop_process(self.proc, timeout_s=20)
        return err or ""


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    directory = tmp_path / "certs"
    ca = make_ca(directory, "ca")
    cert, key = signed_cert(ca, "tls", BOTH_WAYS)
    assert (cert.name, key.name) == ("tls.pem", "tls.key")
    return directory


@pytest.fixture
def deployment(
    tmp_path: Path, own_redis_server: ServerProcess, certs: Path
) -> Iterator[Deployment]:
    ads = AdsServer(ServerTls(certs / "tls.pem", certs / "tls.key", certs / "ca.pem")).start()
    ads.push([gateway_config(2, rls.SECOND)], "eg-1")
    running = Deployment(tmp_path, ads, own_redis_server, certs)
    try:
        yield running
    finally:
        running.stop()
        ads.stop()


def decide(deployment: Deployment, address: str) -> wire.RateLimitResponse:
    entries = [*GATEWAY_PREFIX, ("remote_address", address)]
    stub = rls_stub(deployment.channel)
    reply: wire.RateLimitResponse = stub.ShouldRateLimit(
        request(GATEWAY_DOMAIN, entries), timeout=5
    )
    return reply


def wait_until(check: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (grpc.RpcError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:g} s")


def test_envoy_gateways_deployment_runs_with_only_the_image_changed(
    deployment: Deployment, own_redis_server: ServerProcess
) -> None:
    wait_until(lambda: decide(deployment, "10.0.0.1").statuses[0].current_limit.requests_per_unit)
    codes = [decide(deployment, "10.0.0.2").overall_code for _ in range(3)]
    assert codes == [wire.Code.OK, wire.Code.OK, wire.Code.OVER_LIMIT]
    health = health_pb2_grpc.HealthStub(deployment.channel).Check(
        health_pb2.HealthCheckRequest(service="ratelimit"), timeout=5
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert http_call(deployment.port, "/healthcheck") == (200, "OK")
    status, text = http_call(deployment.debug_port, "/rlconfig")
    assert status == 200 and "unit=SECOND requests_per_unit=2" in text
    pairs = [*GATEWAY_PREFIX, ("remote_address", "10.0.0.2")]
    body = {"domain": GATEWAY_DOMAIN, "descriptors": [{"entries": [
        {"key": k, "value": v} for k, v in pairs]}]}  # fmt: skip
    status, text = http_call(deployment.debug_port, "/json", json.dumps(body).encode())
    assert status == 429 and json.loads(text)["overallCode"] == "OVER_LIMIT"
    with own_redis_server.client() as client:  # the counts reached the Redis REDIS_URL names
        wait_until(lambda: client.keys("rls:*"))
    stderr = deployment.stop()
    assert "ignoring USE_STATSD" in stderr and "ignoring GRPC_SERVER_TLS_CA_CERT" in stderr
