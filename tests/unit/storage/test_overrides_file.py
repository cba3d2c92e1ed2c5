"""The override file under --state-dir: the memory store's semantics, kept across restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ratelimit_sidecar.overrides.file_store import FILE_NAME, FileOverrideStore
from ratelimit_sidecar.overrides.store import MemoryOverrideStore
from ratelimit_sidecar.storage.errors import StoreError


def doc(override_id: str, per_minute: int) -> dict[str, object]:
    return {"id": override_id, "rate_limit": {"unit": "minute", "requests_per_unit": per_minute}}


async def _writes(store: MemoryOverrideStore) -> None:
    await store.put(doc("a", 10), 1)
    await store.put(doc("b", 20), 2)
    await store.put(doc("a", 30), 3)
    await store.delete("b", 4)
    await store.rollback(2, 5)


async def test_it_behaves_as_the_memory_store(tmp_path: Path) -> None:
    memory, file = MemoryOverrideStore(), FileOverrideStore(str(tmp_path))
    await _writes(memory)
    await _writes(file)

    assert await file.read() == await memory.read()
    assert await file.history() == await memory.history()


async def test_a_restart_loads_the_set_and_its_history(tmp_path: Path) -> None:
    first = FileOverrideStore(str(tmp_path))
    await _writes(first)

    again = FileOverrideStore(str(tmp_path))

    assert await again.read() == await first.read()
    assert await again.history() == await first.history()
    assert await again.put(doc("c", 1), 6) == 6


async def test_the_file_is_replaced_whole_and_no_temporary_is_left(tmp_path: Path) -> None:
    store = FileOverrideStore(str(tmp_path))
    await store.put(doc("a", 10), 1)
    inode = (tmp_path / FILE_NAME).stat().st_ino

    await store.put(doc("a", 20), 2)

    assert (tmp_path / FILE_NAME).stat().st_ino != inode  # renamed over, not rewritten in place
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["version"] == 2 and saved["documents"]["a"] == doc("a", 20)


async def test_a_failed_write_changes_nothing_and_raises_a_store_error(tmp_path: Path) -> None:
    store = FileOverrideStore(str(tmp_path))
    await store.put(doc("a", 10), 1)
    # A directory where the temporary file goes: the write fails as a full disk would.
    (tmp_path / f".{FILE_NAME}.{os.getpid()}.tmp").mkdir()

    with pytest.raises(StoreError, match="cannot write"):
        await store.put(doc("a", 20), 2)

    assert (await store.read()).documents == {"a": doc("a", 10)}
    assert (await store.read()).version == 1
    assert len(await store.history()) == 1


async def test_a_change_by_another_process_is_read(tmp_path: Path) -> None:
    mine, other = FileOverrideStore(str(tmp_path)), FileOverrideStore(str(tmp_path))
    await mine.put(doc("a", 10), 1)

    assert (await other.read()).documents == {"a": doc("a", 10)}
    assert await other.put(doc("b", 1), 2) == 2
    assert (await mine.read()).version == 2


def test_an_unreadable_file_is_set_aside_not_lost(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("{not json")

    store = FileOverrideStore(str(tmp_path))

    assert store.version == 0
    aside = [name for name in os.listdir(tmp_path) if name.startswith(FILE_NAME + ".unreadable")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_text() == "{not json"


@pytest.mark.parametrize("text", ["[]", "null", "3"])
async def test_valid_json_that_is_not_an_object_is_set_aside(tmp_path: Path, text: str) -> None:
    (tmp_path / FILE_NAME).write_text(text)

    store = FileOverrideStore(str(tmp_path))

    assert store.version == 0 and (await store.read()).version == 0
    aside = [name for name in os.listdir(tmp_path) if name.startswith(FILE_NAME + ".unreadable")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_text() == text
    assert await store.put(doc("a", 10), 1) == 1
