"""Hot reload in a running sidecar: new limits within 2 s, broken files keep the last good."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

RULE = (
    "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, Path]]:
    path = tmp_path / "r.yaml"
    path.write_text(RULE.format(n=5))
    settings = Settings(
        config_path=str(path), grpc_address="127.0.0.1:0", metrics_address="127.0.0.1:0"
    )
    sidecar = Sidecar(settings, load_rules(path))
    await sidecar.startup()
    yield sidecar, path
    await sidecar.shutdown()


async def remaining(sidecar: Sidecar, value: str = "v") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        reply = await rls_stub(channel).ShouldRateLimit(request("r", [("k", value)]))
    return int(reply.statuses[0].limit_remaining)


async def wait_for(check: object, timeout_s: float = 2.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await check():  # type: ignore[operator]
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError("not within 2 s")


async def test_a_changed_limit_takes_effect_within_two_seconds(
    running: tuple[Sidecar, Path],
) -> None:
    sidecar, path = running
    assert await remaining(sidecar) == 4
    load = asyncio.create_task(_load(sidecar, 1000))  # bounded: 1000 requests
    path.write_text(RULE.format(n=5000))
    await wait_for(lambda: _version_changed(sidecar, "5000"))
    assert await remaining(sidecar, "other") == 4999
    assert await load > 0  # the load kept being answered across the swap


async def test_counters_of_unchanged_rules_survive_a_reload(running: tuple[Sidecar, Path]) -> None:
    sidecar, path = running
    assert await remaining(sidecar, "kept") == 4
    path.write_text(
        RULE.format(n=5) + "  - key: extra\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    before = sidecar.handler.rules.version
    await wait_for(lambda: _changed(sidecar, before))
    assert await remaining(sidecar, "kept") == 3  # the count of 1 was kept


async def test_a_broken_file_keeps_the_last_good_rules(running: tuple[Sidecar, Path]) -> None:
    sidecar, path = running
    good = sidecar.handler.rules.version
    path.write_text("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
    await wait_for(lambda: _counted(sidecar))
    assert sidecar.handler.rules.version == good
    assert await remaining(sidecar) == 4


async def _version_changed(sidecar: Sidecar, rpu: str) -> bool:
    rules = sidecar.handler.rules.domain("r")
    return rules is not None and any(
        r.limit is not None and str(r.limit.requests_per_unit) == rpu for r in rules.rules()
    )


async def _changed(sidecar: Sidecar, version: str) -> bool:
    return sidecar.handler.rules.version != version


async def _counted(sidecar: Sidecar) -> bool:
    name = "ratelimit_sidecar_config_load_errors_total"
    return (sidecar.metrics.registry.get_sample_value(name) or 0) >= 1


async def _load(sidecar: Sidecar, count: int) -> int:
    answered = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        stub = rls_stub(channel)
        for i in range(count):
            await stub.ShouldRateLimit(request("r", [("k", f"load{i % 7}")]))
            answered += 1
    return answered
