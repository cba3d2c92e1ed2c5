"""bench/rawload.py against a real sidecar on the fast transport: distinct bodies answered and
counted, and each kind of failure reported (a gRPC error, a refusal, the server going away)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.load.clients import RAWLOAD, LoadShape, RawLoad
from bench.workload import key_values, request, workload
from harness.h2raw import grpc_message
from harness.net import free_port
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire

RULES = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    rules = write_rules(tmp_path_factory.mktemp("rawload"), RULES)
    process = SidecarProcess(rules, transport="fast").wait_ready()
    yield process
    assert process.stop() == 0, process.stderr


def rawload(
    address: str, bodies: Sequence[bytes], workdir: Path, *, duration_s: float = 1.0
) -> tuple[dict[str, Any], array[float]]:
    """One run, 4 connections x 8 streams, no settle time: its summary and latencies."""
    frames, latencies = workdir / "frames.bin", workdir / "latencies.bin"
    frames.write_bytes(b"".join(bodies))
    config = {
        "address": address, "path": wire.METHOD_PATH, "frames": str(frames), "offset": 0,
        "connections": 4, "streams": 8, "settleS": 0.0, "durationS": duration_s,
        "latencyFile": str(latencies),
    }  # fmt: skip
    argv = [sys.executable, str(RAWLOAD), json.dumps(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout), array("d", latencies.read_bytes())


def test_distinct_bodies_are_answered_and_timed(sidecar: SidecarProcess, tmp_path: Path) -> None:
    bodies = workload("distinct", key_values(500)).frames
    summary, latencies = rawload(sidecar.address, bodies, tmp_path)
    assert (summary["errors"], summary["first_error"]) == (0, "")
    assert summary["requests"] == len(latencies) > 500
    assert summary["sent"] >= summary["requests"]
    assert 0 < min(latencies) <= max(latencies) < 1000


def test_a_grpc_error_is_counted_with_its_reason(sidecar: SidecarProcess, tmp_path: Path) -> None:
    bodies = [grpc_message(request(f"v{i}", domain="").SerializeToString()) for i in range(3)]
    summary, latencies = rawload(sidecar.address, bodies, tmp_path, duration_s=0.5)
    assert summary["requests"] == len(latencies) == 0
    assert summary["errors"] > 0
    assert summary["first_error"].startswith("grpc-status 3: ")
    assert "domain must not be empty" in summary["first_error"]


def test_a_refusal_is_an_error(sidecar: SidecarProcess, tmp_path: Path) -> None:
    bodies = [grpc_message(request("x", key="blocked").SerializeToString())]
    summary, latencies = rawload(sidecar.address, bodies, tmp_path, duration_s=0.5)
    assert (summary["requests"], len(latencies)) == (0, 0)
    assert summary["errors"] > 0
    assert summary["first_error"] == "overall_code not OK"


def test_a_server_going_away_is_an_error(tmp_path: Path) -> None:
    process = SidecarProcess(write_rules(tmp_path, RULES), transport="fast").wait_ready()
    stopper = threading.Timer(0.5, process.stop)
    stopper.start()
    try:
        summary, _ = rawload(process.address, workload("w", ["a"]).frames, tmp_path)
    finally:
        stopper.join()
        process.stop()
    assert summary["requests"] > 0
    assert summary["errors"] > 0
    assert summary["first_error"].startswith(("GOAWAY", "connection closed"))


def test_the_bench_client_continues_the_rotation_and_reports_a_failed_start(
    sidecar: SidecarProcess, tmp_path: Path
) -> None:
    client, load = RawLoad(), workload("w", key_values(20_000))
    shape = LoadShape(connections=2, streams=4, settle_s=0.0, duration_s=0.3)
    first = client.start(sidecar.address, load, shape, tmp_path, []).finish(10.0)
    assert first.errors == 0
    assert first.requests == len(first.latencies_ms) > 0
    offset = client.offsets[("w", sidecar.address)]  # twice what the slower connection sent
    assert offset % 2 == 0
    assert first.sent / 2 <= offset <= first.sent < 20_000
    dead = f"127.0.0.1:{free_port()}"
    failed = client.start(dead, load, shape, tmp_path, []).finish(10.0)
    assert failed.errors == 1
    assert "ConnectionRefusedError" in failed.first_error
