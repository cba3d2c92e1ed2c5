"""The deployment manifests under deploy/: every variable is one the sidecar knows, and every
port and probe they name is one the sidecar serves with that environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ratelimit_sidecar.app.flags import OPTIONS
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.cli.reference import known, translate
from ratelimit_sidecar.http_server.endpoints import HEALTH_PATHS, Endpoints

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))
IMAGE = "ratelimit-sidecar"
RLS = {option.env: option.name for option in OPTIONS}
METRICS_PATHS = frozenset(Endpoints(None, None, None, "").routes(lambda _q: (200, "", b"")))  # type: ignore[arg-type]
PATHS = {
    "metrics_address": METRICS_PATHS,
    "health_address": frozenset(HEALTH_PATHS),
    "debug_address": frozenset({"/rlconfig", "/json"}),
    "grpc_address": frozenset(),
}


def containers(path: Path) -> Iterator[dict[str, Any]]:
    """Our containers: in a Deployment's pod, or what an `EnvoyGateway` sets on the rate limit
    Deployment it generates (which runs /bin/ratelimit)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if doc.get("kind") == "EnvoyGateway":
            generated = doc["provider"]["kubernetes"]["rateLimitDeployment"]["container"]
            found = [{"command": ["/bin/ratelimit"], "env": [], **generated}]
        else:
            found = doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        yield from (c for c in found if IMAGE in c.get("image", ""))


def served(container: dict[str, Any]) -> dict[int, frozenset[str]]:
    """Port -> HTTP paths (empty for gRPC) the sidecar serves with this container's env."""
    env = {item["name"]: item.get("value", "<from a secret>") for item in container["env"]}
    values: dict[str, Any] = {}
    if container.get("command") == ["/bin/ratelimit"]:
        values |= {RLS[name]: value for name, value in translate(env).variables.items()}
    values |= {RLS[name]: value for name, value in env.items() if name in RLS}
    settings = Settings(**{"config_path": "/", **values})
    ports: dict[int, frozenset[str]] = {}
    for field, paths in PATHS.items():
        address = getattr(settings, field)
        if address:
            port = int(address.rpartition(":")[2])
            ports[port] = ports.get(port, frozenset()) | paths
    return ports


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_variable_is_known(path: Path) -> None:
    found = list(containers(path))
    assert found, f"{path} has no {IMAGE} container"
    for container in found:
        reference = container.get("command") == ["/bin/ratelimit"]
        names = [item["name"] for item in container["env"]]
        unknown = [n for n in names if n not in RLS and not (reference and known(n))]
        assert unknown == [], f"{path}: variables the sidecar does not read: {unknown}"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_port_and_probe_is_served(path: Path) -> None:
    for container in containers(path):
        ports = served(container)
        for item in container.get("ports", []):
            assert item["containerPort"] in ports, f"{path}: port {item} is not served"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):  # kubelet's, HTTP
            get = container.get(probe, {}).get("httpGet")
            if get is not None:
                assert get["path"] in ports.get(get["port"], ()), f"{path}: {probe} {get}"


def test_the_image_has_the_references_command() -> None:
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    assert "/bin/ratelimit" in dockerfile
