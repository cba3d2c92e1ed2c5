"""The reference override store: versions, history and rollback."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit_sidecar.overrides.store import (
    HISTORY,
    MemoryOverrideStore,
    UnknownVersion,
)


def doc(override_id: str, per_minute: int) -> dict[str, object]:
    return {"id": override_id, "rate_limit": {"unit": "minute", "requests_per_unit": per_minute}}


def test_every_write_raises_the_version_and_is_recorded() -> None:
    async def scenario() -> None:
        store = MemoryOverrideStore()
        assert await store.put(doc("a", 10), 1) == 1
        assert await store.put(doc("a", 20), 2) == 2
        assert await store.delete("missing", 3) is None
        assert await store.delete("a", 4) == 3
        changes = await store.history()
        assert [c.action for c in changes] == ["delete", "put", "put"]
        assert changes[1].touched == (("a", doc("a", 10), doc("a", 20)),)
        assert (await store.read()).documents == {}

    asyncio.run(scenario())


def test_rollback_restores_the_set_of_that_version_as_a_new_version() -> None:
    async def scenario() -> None:
        store = MemoryOverrideStore()
        await store.put(doc("a", 10), 1)
        await store.put(doc("b", 5), 2)  # version 2: a=10, b=5
        await store.put(doc("a", 99), 3)
        await store.delete("b", 4)
        assert await store.rollback(2, 5) == 5
        assert (await store.read()).documents == {"a": doc("a", 10), "b": doc("b", 5)}
        assert await store.rollback(4, 6) == 6  # a rollback can itself be undone
        assert (await store.read()).documents == {"a": doc("a", 99)}
        assert await store.rollback(0, 7) == 7
        assert (await store.read()).documents == {}

    asyncio.run(scenario())


def test_versions_beyond_the_history_cannot_be_rolled_back_to() -> None:
    async def scenario() -> None:
        store = MemoryOverrideStore()
        for n in range(HISTORY + 5):
            await store.put(doc("a", n + 1), n)
        assert len(await store.history()) == HISTORY
        with pytest.raises(UnknownVersion):
            await store.rollback(3, 999)
        with pytest.raises(UnknownVersion):
            await store.rollback(HISTORY + 6, 999)
        await store.rollback(5, 999)  # the oldest change kept is version 6: 5 is reachable
        assert (await store.read()).documents == {"a": doc("a", 5)}

    asyncio.run(scenario())
