"""Health probes against a real sidecar whose metrics port is held by idle and trickling clients.

A kubelet restarts a sidecar whose liveness probe times out: a slowloris client on the port
must not make a healthy sidecar look dead.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from harness.net import http_ok
from harness.rules import write_rules
from harness.sidecar import SidecarProcess

IDLE, TRICKLING, PROBES = 300, 20, 10


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[SidecarProcess]:
    process = SidecarProcess(write_rules(tmp_path)).wait_ready()
    try:
        yield process
    finally:
        process.stop()


def _hold(stack: ExitStack, port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        conn = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=2))
        held.append(conn)
    return held


def test_probes_are_answered_while_hundreds_of_idle_clients_hold_the_port(
    sidecar: SidecarProcess,
) -> None:
    url = f"http://127.0.0.1:{sidecar.metrics_port}/healthz"
    with ExitStack() as stack:
        _hold(stack, sidecar.metrics_port, IDLE)
        trickling = _hold(stack, sidecar.metrics_port, TRICKLING)
        answered = 0
        for _ in range(PROBES):
            for conn in trickling:  # a byte of a request head that never ends
                conn.send(b"G")
            answered += http_ok(url, timeout_s=1.0)
            time.sleep(0.05)
    assert answered >= PROBES - 1, f"{answered} of {PROBES} probes answered within 1 s"
    assert sidecar.proc.poll() is None
