"""The benchmark's per-request-Redis baseline server (bench/limits_server.py) against real Redis.

It must answer OK with a status per descriptor while Redis is up, answer UNAVAILABLE (not hang)
when Redis is killed, and recover when Redis is back; the section's outage rows rely on this.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("limits")

from bench.baseline import baseline_spec
from bench.baseline_outage import first_answer
from bench.frames import frames_for
from bench.servers import ServerProcess, free_port, start_server
from harness.redis_servers import ServerProcess as RedisProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def limits_server(own_redis_server: RedisProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    address = f"127.0.0.1:{free_port()}"
    server = start_server(baseline_spec(address, own_redis_server.url), None, tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_answers_ok_then_unavailable_without_redis_then_recovers(
    limits_server: ServerProcess, own_redis_server: RedisProcess
) -> None:
    frame = frames_for(["c1"])[0]
    assert first_answer(limits_server.address, frame).code == "OK"

    own_redis_server.kill()
    down = first_answer(limits_server.address, frame)
    assert down.code == "UNAVAILABLE"
    assert down.seconds < 2.0
    assert "redis" in down.detail

    own_redis_server.start()
    assert first_answer(limits_server.address, frame).code == "OK"


def test_counts_in_redis(limits_server: ServerProcess, own_redis_server: RedisProcess) -> None:
    frame = frames_for(["counted"])[0]
    for _ in range(3):
        assert first_answer(limits_server.address, frame).code == "OK"
    with own_redis_server.client() as client:
        keys = client.keys("LIMITS:*counted*")
        assert len(keys) == 1
        assert int(client.get(keys[0])) == 3
