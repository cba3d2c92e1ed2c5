"""`--grpc-max-connection-age-s`: an old connection gets GOAWAY (its client reconnects and
re-resolves the name), its calls the grace, then it is closed; on both transports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.h2raw import RawH2
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode

AGE = ("--grpc-max-connection-age-s", "0.5", "--grpc-max-connection-age-grace-s", "0.5")


@pytest.mark.parametrize("transport", ["fast", "grpcio"])
def test_an_old_connection_gets_goaway_then_is_closed(tmp_path: Path, transport: str) -> None:
    sidecar = SidecarProcess(write_rules(tmp_path), *AGE, transport=transport).wait_ready()
    raw = RawH2(sidecar.port)
    try:
        opened = time.monotonic()
        frame = raw.goaway(timeout_s=10)
        aged_after = time.monotonic() - opened
        assert frame is not None, "no GOAWAY for an old connection"
        assert frame.error_code == ErrorCode.NO_ERROR
        assert 0.3 <= aged_after <= 5.0
        deadline = time.monotonic() + 10
        while raw.read_frame(timeout_s=1) is not None:  # what is left, then the close
            assert time.monotonic() < deadline, "the connection outlived its grace"
    finally:
        raw.close()
        sidecar.stop()


def test_without_the_setting_connections_are_not_aged(tmp_path: Path) -> None:
    sidecar = SidecarProcess(write_rules(tmp_path)).wait_ready()
    raw = RawH2(sidecar.port)
    try:
        with pytest.raises(TimeoutError):  # nothing arrives: no GOAWAY, no close
            raw.goaway(timeout_s=1.5)
    finally:
        raw.close()
        sidecar.stop()
