"""The `ratelimit-sidecar` command as a subprocess: serve, signals, startup errors, check."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from harness.sidecar import SidecarProcess, run_cli
from ratelimit_sidecar._proto import wire


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_and_stops_gracefully(tmp_path: Path, sig: int) -> None:
    sidecar = SidecarProcess(write_rules(tmp_path), "--node-id", "cli-test").wait_ready()
    try:
        with grpc.insecure_channel(sidecar.address) as channel:
            stub = rls_stub(channel)
            time.sleep(1.02 - time.time() % 1)  # 3 a second: all four within one window
            codes = [
                stub.ShouldRateLimit(request("gateway", [("client", "x")]), timeout=5).overall_code
                for _ in range(4)
            ]
    finally:
        code = sidecar.stop(sig)
    assert codes == [wire.Code.OK] * 3 + [wire.Code.OVER_LIMIT]
    assert code == 0
    assert "local-only" in sidecar.stderr and "node cli-test" in sidecar.stderr
    assert "stopped" in sidecar.stderr


def test_environment_variables_configure_serve(tmp_path: Path) -> None:
    sidecar = SidecarProcess(
        write_rules(tmp_path), env={"RLS_SHADOW_MODE": "true", "RLS_NODE_ID": "from-env"}
    ).wait_ready()
    try:
        with grpc.insecure_channel(sidecar.address) as channel:
            stub = rls_stub(channel)
            reply = stub.ShouldRateLimit(request("gateway", [("blocked", "x")]), timeout=5)
    finally:
        sidecar.stop()
    assert reply.overall_code == wire.Code.OK  # a deny rule, but global shadow mode
    assert "node from-env" in sidecar.stderr and "shadow mode" in sidecar.stderr


def test_port_taken_exits_non_zero_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli(
            ["serve", "--config", str(write_rules(tmp_path)), "--grpc-address", f"127.0.0.1:{port}"]
        )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ratelimit-sidecar: error: cannot listen on 127.0.0.1:{port}")


def test_bad_config_exits_non_zero_naming_file_and_line(tmp_path: Path) -> None:
    path = write_rules(tmp_path, "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n")
    result = run_cli(["serve", "--config", str(path)])
    assert result.returncode == 1
    assert "invalid configuration" in result.stderr
    assert f"{path}:4" in result.stderr and "rate_limt" in result.stderr


def test_check_accepts_the_spec_example_and_rejects_a_broken_file(tmp_path: Path) -> None:
    good = run_cli(["check", str(write_rules(tmp_path))])
    assert good.returncode == 0, good.stderr
    text = (
        "domain: d\ndescriptors:\n  - key: a\n"
        "    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
    )
    bad = write_rules(tmp_path, text, "bad.yaml")
    result = run_cli(["check", str(bad)])
    assert result.returncode == 1
    assert f"{bad}:4" in result.stderr and "fortnight" in result.stderr


def test_no_redis_password_in_logs_or_endpoints(tmp_path: Path) -> None:
    import urllib.request

    from harness.net import free_port

    url = f"redis://app:s3cretpw@127.0.0.1:{free_port()}/0"  # nothing listens: fail open
    sidecar = SidecarProcess(write_rules(tmp_path), "--redis-url", url).wait_ready()
    try:
        with grpc.insecure_channel(sidecar.address) as channel:
            stub = rls_stub(channel)
            reply = stub.ShouldRateLimit(request("gateway", [("client", "x")]), timeout=5)
        ready_url = f"http://127.0.0.1:{sidecar.metrics_port}/readyz"
        with urllib.request.urlopen(ready_url, timeout=5) as answer:
            ready = answer.read().decode()
        import time

        time.sleep(1.2)  # let a sync fail and be logged
    finally:
        sidecar.stop()
    assert reply.overall_code == wire.Code.OK  # Redis is down, the sidecar answers anyway
    assert "s3cretpw" not in sidecar.stderr and "s3cretpw" not in ready
    assert "redis://127.0.0.1" in sidecar.stderr or "redis://app:***" in sidecar.stderr
