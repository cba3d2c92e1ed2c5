"""The override keeper: loads, applies, skips what no longer parses, expires, survives a store
that cannot be read."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.keeper import OverrideKeeper
from ratelimit_sidecar.overrides.model import OverrideBounds, parse_override
from ratelimit_sidecar.overrides.store import MemoryOverrideStore, OverrideSnapshot
from ratelimit_sidecar.storage.errors import StoreUnavailable

T0 = 1_796_083_000_000


class FlakyStore(MemoryOverrideStore):
    """The memory store, unreachable while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def read(self) -> OverrideSnapshot:
        if self.down:
            raise StoreUnavailable("connection refused")
        return await super().read()


def document(value: str, per_minute: int = 5, expires_at: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {
        "domain": "gateway",
        "descriptor": [{"key": "api_key", "value": value}],
        "rate_limit": {"unit": "minute", "requests_per_unit": per_minute},
    }
    if expires_at:
        body["expires_at"] = expires_at
    return dict(parse_override(body, OverrideBounds()).document)


class Applied:
    def __init__(self) -> None:
        self.sets: list[AppliedOverrides] = []

    def __call__(self, applied: AppliedOverrides) -> None:
        self.sets.append(applied)

    @property
    def last(self) -> AppliedOverrides:
        return self.sets[-1]


def _keeper(
    store: MemoryOverrideStore, clock: list[int] | None, refresh_s: float = 10.0
) -> tuple[OverrideKeeper, Applied]:
    """A keeper on `clock` (a fake one: `clock[0]`), or on the real clock if None."""
    applied = Applied()
    now = (lambda: int(time.time() * 1000)) if clock is None else (lambda: clock[0])
    keeper = OverrideKeeper(store, applied, now, OverrideBounds(), refresh_s=refresh_s)
    return keeper, applied


async def test_start_applies_the_stores_set_and_an_unchanged_version_is_not_applied_again() -> None:
    store = FlakyStore()
    await store.put(document("a"), T0)
    keeper, applied = _keeper(store, [T0])

    await keeper.start()
    await keeper.refresh()

    assert len(applied.sets) == 1
    assert applied.last.version == 1 and len(applied.last.rules) == 1
    assert applied.last.domains == frozenset({"gateway"})


async def test_a_document_that_no_longer_parses_is_skipped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore()
    await store.put(document("a"), T0)
    broken = {**document("b"), "rate_limit": {"unit": "fortnight"}}
    await store.put(broken, T0)
    await store.put({**document("c"), "id": "ovr_not_its_id"}, T0)
    keeper, applied = _keeper(store, [T0])

    with caplog.at_level(logging.WARNING):
        await keeper.refresh()

    assert [o.document["descriptor"] for o in keeper.in_force] == [document("a")["descriptor"]]
    assert "invalid unit 'fortnight'" in caplog.text and "ovr_not_its_id" in caplog.text
    assert len(applied.last.rules) == 1


async def test_the_store_down_keeps_the_last_set() -> None:
    store = FlakyStore()
    await store.put(document("a"), T0)
    keeper, applied = _keeper(store, [T0])
    await keeper.refresh()
    store.down = True

    assert await keeper.refresh() is False
    assert not keeper.store_up and "refused" in keeper.last_error
    assert len(applied.last.rules) == 1 and len(applied.sets) == 1
    store.down = False
    await store.put(document("b"), T0)
    assert await keeper.refresh() and keeper.store_up and len(applied.last.rules) == 2


async def test_an_expired_override_stops_applying_at_its_time() -> None:
    store, clock = FlakyStore(), [T0]
    await store.put(document("a", expires_at="2026-12-01T00:00:00Z"), T0)
    await store.put(document("b"), T0)
    keeper, applied = _keeper(store, clock)
    await keeper.refresh()
    assert len(applied.last.rules) == 2

    clock[0] = 1_796_083_200_000 - 1
    keeper.apply_current()
    assert len(applied.last.rules) == 2
    clock[0] = 1_796_083_200_000
    keeper.apply_current()
    assert [o.document["descriptor"] for o in keeper.in_force] == [document("b")["descriptor"]]


async def test_the_keeper_expires_and_rereads_on_its_own() -> None:
    """No call: `run` wakes at the next expiry and every `refresh_s` (real time, bounded)."""
    store = FlakyStore()
    soon = time.time() + 0.3
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(soon)) + f".{int(soon % 1 * 1000):03d}Z"
    await store.put(document("a", expires_at=stamp), T0)
    keeper, _ = _keeper(store, None, refresh_s=0.1)
    await keeper.refresh()
    assert len(keeper.in_force) == 1
    task = asyncio.create_task(keeper.run())
    try:
        await store.put(document("b"), T0)  # written behind the keeper's back
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and [o.entries for o in keeper.in_force] != [
            (("api_key", "b"),)
        ]:
            await asyncio.sleep(0.02)
    finally:
        keeper.stop()
        await asyncio.wait_for(task, 2.0)

    assert [o.entries for o in keeper.in_force] == [(("api_key", "b"),)]
    assert time.time() >= soon


async def test_without_a_store_the_set_is_empty() -> None:
    applied = Applied()
    keeper = OverrideKeeper(None, applied, lambda: T0, OverrideBounds())

    await keeper.start()

    assert keeper.snapshot.version == 0 and keeper.in_force == ()


async def test_an_empty_set_is_installed_once_not_at_every_read() -> None:
    """Version 0 read again and again: the handler (and its compiled-request cache) is left
    alone after the first install."""
    keeper, applied = _keeper(FlakyStore(), [T0])

    await keeper.start()
    for _ in range(3):
        await keeper.refresh()

    assert len(applied.sets) == 1 and applied.last.version == 0


class BrokenStore(FlakyStore):
    """A store whose read fails with an unexpected error `failures` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def read(self) -> OverrideSnapshot:
        if self.failures > 0:
            self.failures -= 1
            raise AttributeError("'list' object has no attribute 'get'")
        return await super().read()


async def test_the_periodic_read_survives_an_unexpected_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = BrokenStore(failures=2)
    await store.put(document("a"), T0)
    keeper, _ = _keeper(store, [T0], refresh_s=0.02)
    task = asyncio.create_task(keeper.run())
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not keeper.in_force and not task.done():
            await asyncio.sleep(0.02)
    finally:
        keeper.stop()
        await asyncio.wait_for(task, 2.0)

    assert len(keeper.in_force) == 1
    assert "override refresh failed" in caplog.text
