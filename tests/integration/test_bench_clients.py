"""bench's own HTTP/2 load generators (bench/rawload.py in Python, bench/leanload.c in C) against
a real sidecar on the fast transport, through the bench's client interface: distinct bodies
answered and counted, each kind of failure reported (a gRPC error, a refusal, the server going
away), and the rotation of bodies continued from one run to the next."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bench.load.clients import Client, LoadShape, RawLoad, RawResult
from bench.load.leanload import LeanLoad
from bench.workload import Workload, key_values, request, workload
from harness.h2raw import grpc_message
from harness.net import free_port
from harness.rules import write_rules
from harness.sidecar import SidecarProcess

RULES = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
"""
SHAPE = LoadShape(connections=4, streams=8, settle_s=0.0, duration_s=1.0)
SHORT = LoadShape(connections=2, streams=4, settle_s=0.0, duration_s=0.5)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    rules = write_rules(tmp_path_factory.mktemp("clients"), RULES)
    process = SidecarProcess(rules, transport="fast").wait_ready()
    yield process
    assert process.stop() == 0, process.stderr


@pytest.fixture(params=[RawLoad, LeanLoad], ids=["rawload", "leanload"])
def client(request: pytest.FixtureRequest) -> Client:
    made: Client = request.param()
    assert made.unavailable() is None  # the C compiler is installed wherever tests run
    return made


def run(client: Client, address: str, load: Workload, workdir: Path, shape: LoadShape) -> RawResult:
    return client.start(address, load, shape, workdir, []).finish(30.0)


def test_distinct_bodies_are_answered_and_timed(
    client: Client, sidecar: SidecarProcess, tmp_path: Path
) -> None:
    tracked = sidecar.metric("tracked_keys")
    load = workload("distinct", key_values(500, prefix=client.name))  # new to the sidecar
    result = run(client, sidecar.address, load, tmp_path, SHAPE)
    assert (result.errors, result.first_error) == (0, "")
    assert result.requests == len(result.latencies_ms) > 4 * 500  # each connection, each body
    assert sidecar.metric("tracked_keys") == tracked + 500
    assert result.sent >= result.requests
    assert 0 < min(result.latencies_ms) <= max(result.latencies_ms) < 1000


def test_a_grpc_error_is_counted_with_its_reason(
    client: Client, sidecar: SidecarProcess, tmp_path: Path
) -> None:
    bodies = [grpc_message(request(f"v{i}", domain="").SerializeToString()) for i in range(3)]
    result = run(client, sidecar.address, Workload("bad", bodies), tmp_path, SHORT)
    assert result.requests == 0
    assert result.errors > 0
    assert result.first_error.startswith("grpc-status 3: ")
    assert "domain must not be empty" in result.first_error


def test_a_refusal_is_an_error(client: Client, sidecar: SidecarProcess, tmp_path: Path) -> None:
    bodies = [grpc_message(request("x", key="blocked").SerializeToString())]
    result = run(client, sidecar.address, Workload("refused", bodies), tmp_path, SHORT)
    assert (result.requests, len(result.latencies_ms)) == (0, 0)
    assert result.errors > 0
    assert result.first_error == "overall_code not OK"


def test_a_server_going_away_is_an_error(client: Client, tmp_path: Path) -> None:
    process = SidecarProcess(write_rules(tmp_path, RULES), transport="fast").wait_ready()
    stopper = threading.Timer(0.5, process.stop)
    stopper.start()
    try:
        result = run(client, process.address, workload("w", ["a"]), tmp_path, SHAPE)
    finally:
        stopper.join()
        process.stop()
    assert result.requests > 0
    assert result.errors > 0
    assert result.first_error.startswith(("GOAWAY", "connection closed"))


def test_runs_continue_the_rotation_and_a_failed_start_is_reported(
    client: Client, sidecar: SidecarProcess, tmp_path: Path
) -> None:
    load, shape = workload("w", key_values(100_000)), replace(SHORT, duration_s=0.3)
    first = run(client, sidecar.address, load, tmp_path, shape)
    assert first.errors == 0
    assert first.requests == len(first.latencies_ms) > 0
    offsets: dict[tuple[str, str], int] = client.offsets  # type: ignore[attr-defined]
    offset = offsets[("w", sidecar.address)]  # twice what the slower connection sent
    assert offset % 2 == 0
    # How the connections shared the run depends on the scheduler (a loaded machine starves one
    # for a while): the offset is every connection's sending, at most all that was sent.
    assert 0 <= offset <= first.sent < 100_000
    failed = run(client, f"127.0.0.1:{free_port()}", load, tmp_path, shape)
    assert failed.errors >= 1
    assert "refused" in failed.first_error.lower() or "connect" in failed.first_error.lower()
