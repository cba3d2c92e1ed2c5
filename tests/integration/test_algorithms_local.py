"""One real sidecar without Redis (local-only mode) decides every algorithm exactly as its exact
reference (simulate/exact/) does, replayed on the recorded send times of a gRPC sequence."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from harness.exact import ALL, exact_reference
from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_MS, SPANS, MAX = 2000, 4, 10
LIMIT = f"unit: second, unit_multiplier: 2, requests_per_unit: {MAX}, spans: {SPANS}"
RULES = "domain: local\ndescriptors:\n" + "".join(
    f"  - key: {name}\n    rate_limit: {{{LIMIT}, algorithm: {name}}}\n" for name in ALL
)
# (ms after a window's start, hits): bursts in one request each (hits_addend), at moments
# where every algorithm's decision is the same 10 ms before and 40 ms after (so the time a
# request takes to arrive cannot change it), and where the four algorithms disagree:
# fixed window ArrrArrr, sliding window ArArrAAA, token bucket ArAAArAA, sliding log ArArArAr.
SEQUENCE = [(100, 8), (150, 3), (200, 2), (1300, 3), (2250, 6), (2300, 5), (2900, 3), (3000, 2)]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    node = SidecarProcess(write_rules(tmp_path_factory.mktemp("rules"), RULES)).wait_ready()
    try:
        yield node
    finally:
        node.stop()


def next_window_start_ms(lead_ms: int = 300) -> int:
    now = time.time_ns() // 1_000_000
    start = (now // WINDOW_MS + 1) * WINDOW_MS
    return start if start - now >= lead_ms else start + WINDOW_MS


Sent = list[tuple[int, int, bool]]  # (ms, hits, admitted)


@pytest.fixture(scope="module")
def sequences(sidecar: SidecarProcess) -> tuple[int, dict[str, Sent]]:
    """SEQUENCE to every algorithm's rule, one after the other at each step; and its start."""
    start = next_window_start_ms()
    sent: dict[str, Sent] = {name: [] for name in ALL}
    with grpc.insecure_channel(sidecar.address) as channel:
        stub = rls_stub(channel)
        for offset, hits in SEQUENCE:
            time.sleep(max(0.0, (start + offset) / 1000 - time.time()))
            for name in ALL:
                message = request("local", [(name, "v")], hits_addend=hits)
                at = time.time_ns() // 1_000_000
                reply = stub.ShouldRateLimit(message, timeout=5)
                sent[name].append((at, hits, reply.overall_code == wire.Code.OK))
    return start, sent


@pytest.mark.parametrize("algorithm", ALL)
def test_local_decisions_equal_the_exact_reference(
    sequences: tuple[int, dict[str, Sent]], algorithm: str
) -> None:
    start, sent = sequences[0], sequences[1][algorithm]
    reference = exact_reference(algorithm, MAX, WINDOW_MS, SPANS)
    expected = [reference(at, hits) for at, hits, _ in sent]
    got = [admitted for _, _, admitted in sent]
    print(f"{algorithm}: {''.join('A' if a else 'r' for a in got)}")
    assert got == expected, [(at - start, hits) for at, hits, _ in sent]
