"""`--workers 2`: two processes on one gRPC port, each a node, both flushed on SIGTERM."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import grpc

from harness.grpc_client import request, rls_stub
from harness.net import consecutive_free_ports, free_port, wait_grpc_serving
from harness.process import stop_process
from harness.rules import write_rules
from harness.sidecar import start_cli


def test_two_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    port = free_port()
    metrics = consecutive_free_ports(2, avoid=(port,))  # worker 1 takes metrics + 1
    proc = start_cli(
        [
            "serve", "--config", str(write_rules(tmp_path)), "--workers", "2",
            "--grpc-address", f"127.0.0.1:{port}", "--metrics-address", f"127.0.0.1:{metrics}",
            "--node-id", "wk",
        ]
    )  # fmt: skip
    try:
        wait_grpc_serving(f"127.0.0.1:{port}")
        for offset in (0, 1):
            _wait_http(metrics + offset)
        answered = 0
        for _ in range(20):  # new channels get spread over the workers by the kernel
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = rls_stub(channel)
                stub.ShouldRateLimit(request("gateway", [("api_key", "w")]), timeout=5)
                answered += 1
        tracked = [_tracked(metrics + offset) for offset in (0, 1)]
    finally:
        _, err = stop_process(proc, timeout_s=30)
    assert answered == 20
    assert proc.returncode == 0, err
    assert "node wk-w0" in err and "node wk-w1" in err
    assert err.count("stopped") == 2  # both workers drained and flushed
    assert sum(tracked) >= 1


def _wait_http(port: int) -> None:
    import time

    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _tracked(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/keys", timeout=5) as reply:
        return int(json.loads(reply.read())["tracked"])
