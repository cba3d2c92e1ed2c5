"""A flood of fresh descriptor values into a small key table cannot reset a heavy client's
counter, with a real Redis as the shared store and in local-only mode."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from harness.answer import answer_now
from harness.grpc_client import request
from harness.redis_servers import ServerProcess
from harness.rules import write_rules
from ratelimit_sidecar._proto.wire import RateLimitResponse
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.storage.redis_urls import open_redis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_S, MAX, TABLE = 2, 20, 200
RULES = f"""\
domain: gateway
descriptors:
  - key: user
    rate_limit:
      {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX}, spans: 4}}
"""
HEAVY = [f"heavy{i}" for i in range(3)]
TICK_S = 0.005
FLOOD_PER_TICK = 5  # about 1,000 fresh values a second: the table turns over every 0.2 s
WINDOWS = 3


def body(value: str) -> bytes:
    return request("gateway", [("user", value)]).SerializeToString()


async def drive(sidecar: Sidecar) -> Counter[tuple[str, int]]:
    """Heavy clients send every tick (far over MAX) while fresh values flood the table; the
    heavy admissions per (client, window), over whole windows only."""
    rng, admitted = random.Random(3), Counter[tuple[str, int]]()
    window_ms = WINDOW_S * 1000
    first = sidecar.clock.now_ms() // window_ms + 1
    # Until the last window has ended (a loaded machine may take longer), bounded all the same.
    deadline = time.monotonic() + 3 * (WINDOWS + 1) * WINDOW_S
    while time.monotonic() < deadline and sidecar.clock.now_ms() // window_ms < first + WINDOWS:
        for _ in range(FLOOD_PER_TICK):
            answer_now(sidecar.handler, body(f"flood{rng.getrandbits(64)}"))
        window = sidecar.clock.now_ms() // window_ms
        for name in HEAVY:
            answer = RateLimitResponse.FromString(answer_now(sidecar.handler, body(name)))
            if answer.overall_code == 1 and first <= window < first + WINDOWS:
                admitted[name, window] += 1
        await asyncio.sleep(TICK_S)
    return admitted


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "local-only"])
async def test_a_flood_of_fresh_values_does_not_reset_a_heavy_client(
    tmp_path: Path, redis_server: ServerProcess, shared: bool
) -> None:
    rules = load_rules(write_rules(tmp_path, RULES))
    # Every key synced, however quiet (core/quiet_keys.py): the test reads each window's count.
    settings = Settings(config_path=str(tmp_path), grpc_address="127.0.0.1:0",
                        metrics_address="127.0.0.1:0", max_keys=TABLE, quiet_share=0.0)  # fmt: skip
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = open_redis(redis_server.url, prefix, "flood-node") if shared else None
    sidecar = Sidecar(settings, rules, store)
    await sidecar.startup()
    try:
        admitted = await drive(sidecar)
    finally:
        await sidecar.shutdown()
    assert sidecar.limiter.keys.evictions > 1000
    assert len(admitted) == len(HEAVY) * WINDOWS, admitted
    assert all(count <= MAX * 1.05 for count in admitted.values()), admitted
