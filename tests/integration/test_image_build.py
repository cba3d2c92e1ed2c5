"""The container image's wheel, built and installed by deploy/image-wheel.sh as the Dockerfile
runs it (no docker daemon needed): the compiled wheel, installed into a venv apart from the
checkout, whose `ratelimit` command, given only the reference's variables, answers
ShouldRateLimit from a rule file and Redis, and its /healthcheck.

About two minutes (pip installs from PyPI, then mypyc): `-m "not image_build"` deselects it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.net import free_ports, http_call, http_ok
from harness.process import NotReady, Process, launch, stop_process, wait_ready
from harness.redis_servers import ServerProcess
from ratelimit_sidecar._proto import wire

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.image_build]

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "image-wheel.sh"
BUILD_TIMEOUT_S = 900.0  # a cold pip cache, then mypyc on two shared cores (~50 s alone)
INSTALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 30.0
DOMAIN = "image-build"
RULES = f"""\
domain: {DOMAIN}
descriptors:
  - key: PATH
    value: "/"
    rate_limit: {{unit: minute, requests_per_unit: 2}}
"""
# The request path's module, as the venv's interpreter finds it.
WHERE = "import ratelimit_sidecar.core.limiter as m; print(m.__file__)"
SYNC_TIMEOUT_S = 15.0  # a minute window syncs every 10 s


def child_env() -> dict[str, str]:
    """This environment without what would lead a child to the checkout's venv or set the
    sidecar's own variables: only the reference's variables configure it."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("RLS_")}


def log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_script(log: Path, timeout_s: float, *args: str, **env: str) -> None:
    """deploy/image-wheel.sh ARGS from `log`'s directory; all its children (pip, the compiler)
    are killed at the timeout, as the leader of their process group."""
    argv = ["bash", str(SCRIPT), *args]
    proc = launch(argv, log, env={**child_env(), **env}, cwd=log.parent, new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    finally:
        stop_process(proc, group=True, timeout_s=5)
    assert code == 0, f"{SCRIPT.name} {args[0]} exited {code}:\n{log_tail(log)}"


def fresh_venv(path: Path) -> Path:
    """A venv from the running interpreter; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the build stage makes, installed as the image installs it, into a venv of its
    own; the build's own venv is a fresh one too."""
    work = tmp_path_factory.mktemp("image")
    wheels, venv = str(work / "wheels"), work / "venv"
    build_venv = {"BUILD_VENV": str(work / "build-venv")}
    run_script(work / "build.log", BUILD_TIMEOUT_S, "build", wheels, sys.executable, **build_venv)
    run_script(work / "install.log", INSTALL_TIMEOUT_S, "install", wheels, str(fresh_venv(venv)))
    return venv


@dataclass
class Reference:
    """The venv's `ratelimit` command on free loopback ports, its output in `log`."""

    proc: Process
    log: Path
    grpc_port: int
    port: int
    prefix: str  # of its keys in Redis: its test's own


def reference_env(root: Path, redis: ServerProcess, ports: list[int]) -> dict[str, str]:
    """The Istio sample's variables (docs/REFERENCE.md), every port a free loopback one: the
    metrics port too (PROMETHEUS_ADDR), 9090 otherwise, which another run may hold. The key
    prefix is the test's directory's name: one test's counts never pass for another's."""
    port, grpc_port, debug_port, metrics_port = ports
    return {"LOG_LEVEL": "info", "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": f"127.0.0.1:{redis.port}", "USE_STATSD": "false",
            "RUNTIME_ROOT": str(root), "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
            "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "PORT": str(port),
            "GRPC_PORT": str(grpc_port), "DEBUG_PORT": str(debug_port),
            "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": f"127.0.0.1:{metrics_port}",
            "CACHE_KEY_PREFIX": f"{root.name}:"}  # fmt: skip


def start_reference(venv: Path, root: Path, redis: ServerProcess) -> Reference:
    """The venv's command, from outside the checkout, reading its rules where RUNTIME_* say."""
    rules = root / "ratelimit" / "config"
    rules.mkdir(parents=True)
    (rules / "config.yaml").write_text(RULES)
    ports = free_ports(4)
    env = {**child_env(), **reference_env(root, redis, ports)}
    log = root / "ratelimit.log"
    proc = launch([str(venv / "bin" / "ratelimit")], log, env=env, cwd=root, new_session=True)
    return Reference(proc, log, grpc_port=ports[1], port=ports[0], prefix=f"{root.name}:")


@pytest.fixture
def reference(image_venv: Path, tmp_path: Path, redis_server: ServerProcess) -> Iterator[Reference]:
    started = start_reference(image_venv, tmp_path, redis_server)
    try:
        healthcheck = f"http://127.0.0.1:{started.port}/healthcheck"
        try:
            wait_ready(lambda: http_ok(healthcheck), started.proc, START_TIMEOUT_S)
        except NotReady as error:
            pytest.fail(f"ratelimit {error}:\n{log_tail(started.log)}")
        yield started
    finally:
        stop_process(started.proc, group=True, timeout_s=20)


def test_the_installed_package_is_the_compiled_wheel_in_its_venv(
    image_venv: Path, tmp_path: Path
) -> None:
    python = str(image_venv / "bin" / "python")
    found = subprocess.run([python, "-c", WHERE], cwd=tmp_path, env=child_env(), timeout=60,
                           check=True, capture_output=True, text=True)  # fmt: skip
    module = Path(found.stdout.strip()).resolve()
    assert module.is_relative_to(image_venv.resolve()), module
    assert module.name.endswith(".so"), f"{module}: not the compiled module"


def should_rate_limit(reference: Reference, calls: int) -> list[int]:
    """The overall codes of `calls` requests for PATH=/ over the fast gRPC transport."""
    with grpc.insecure_channel(f"127.0.0.1:{reference.grpc_port}") as channel:
        stub = rls_stub(channel)
        message = request(DOMAIN, [("PATH", "/")])
        return [
            stub.ShouldRateLimit(message, timeout=5, wait_for_ready=True).overall_code
            for _ in range(calls)
        ]


def test_its_ratelimit_command_answers_from_the_rules(reference: Reference) -> None:
    codes = should_rate_limit(reference, 3)
    assert codes == [wire.Code.OK, wire.Code.OK, wire.Code.OVER_LIMIT], log_tail(reference.log)


def test_its_counts_reach_redis(reference: Reference, redis_server: ServerProcess) -> None:
    """Through the wheel's Lua scripts (package data): a wheel without them would fail here."""
    should_rate_limit(reference, 1)
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    with redis_server.client() as client:
        while not client.keys(f"{reference.prefix}*") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.keys(f"{reference.prefix}*"), f"none in Redis:\n{log_tail(reference.log)}"


def test_its_healthcheck_answers(reference: Reference) -> None:
    assert http_call(reference.port, "/healthcheck") == (200, "OK")
