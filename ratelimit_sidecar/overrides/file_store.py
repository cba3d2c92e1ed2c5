"""Overrides kept in one JSON file under `--state-dir`, for a node without Redis.

Every change is written before it is answered: to a temporary file, fsynced and renamed over
`overrides.json` (then the directory fsynced): a crash leaves the old file or the new, never a
torn one. A file another worker changed is read again before the next read or write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from ratelimit_sidecar.overrides.store import (
    Change,
    Document,
    MemoryOverrideStore,
    OverrideSnapshot,
    change_of,
)
from ratelimit_sidecar.storage.errors import StoreUnavailable

log = logging.getLogger("ratelimit_sidecar.overrides")

FILE_NAME = "overrides.json"
FORMAT = 1
_T = TypeVar("_T")


class FileOverrideStore(MemoryOverrideStore):
    def __init__(self, state_dir: str) -> None:
        super().__init__()
        self.path = Path(state_dir) / FILE_NAME
        self.description = f"file {self.path}"
        self._stamp: tuple[int, int] | None = None
        self._lock = asyncio.Lock()
        self._load()

    async def read(self) -> OverrideSnapshot:
        self._load()
        return await super().read()

    async def put(self, document: Document, now_ms: int) -> int:
        return await self._saved(partial(super().put, document, now_ms))

    async def delete(self, override_id: str, now_ms: int) -> int | None:
        return await self._saved(partial(super().delete, override_id, now_ms))

    async def history(self) -> tuple[Change, ...]:
        self._load()
        return await super().history()

    async def rollback(self, version: int, now_ms: int) -> int:
        return await self._saved(partial(super().rollback, version, now_ms))

    async def _saved(self, write: Callable[[], Awaitable[_T]]) -> _T:
        """Under the lock, on the file as it is; undone if it cannot be written."""
        async with self._lock:
            self._load()
            before = self.version, dict(self.documents), list(self.changes)
            answer = await write()
            if self.version == before[0]:
                return answer  # nothing changed (a delete of an unknown id)
            text = json.dumps(self._state(), ensure_ascii=False, separators=(",", ":"))
            try:
                await asyncio.to_thread(self._write, text)
            except OSError as exc:
                self.version, self.documents, self.changes = before
                raise StoreUnavailable(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        return answer

    def _state(self) -> dict[str, object]:
        changes = [
            {"version": c.version, "time_ms": c.time_ms, "action": c.action,
             "touched": [list(t) for t in c.touched]}
            for c in self.changes
        ]  # fmt: skip
        return {"format": FORMAT, "version": self.version, "documents": self.documents,
                "changes": changes}  # fmt: skip

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._stamp = _stamp(self.path)

    def _load(self) -> None:
        """Read the file if it changed since this process last read or wrote it."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            version, documents, changes = _parse_state(state)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._set_aside(exc)
            return
        self.version, self.documents, self.changes = version, documents, changes
        self._stamp = stamp

    def _set_aside(self, exc: Exception) -> None:
        """An unparsable file is kept for the operator, under another name."""
        aside = self.path.with_name(f"{FILE_NAME}.unreadable-{int(time.time())}")
        log.error("cannot read %s (%s): moved to %s, starting from the set in memory",
                  self.path, exc, aside)  # fmt: skip
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
        self._stamp = None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_mtime_ns, status.st_size


def _parse_state(state: object) -> tuple[int, dict[str, Document], list[Change]]:
    if not isinstance(state, dict):  # valid JSON but not our object ([] or null)
        raise ValueError(f"not a JSON object but {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise ValueError(f"unknown format {state.get('format')!r}")
    version = int(state["version"])
    documents = dict(state["documents"])
    changes = [change_of(record) for record in state["changes"]]
    return version, documents, changes
