"""Where runtime overrides are kept: the store protocol, its history rule, a memory store.

Stores keep override *documents* (the admin API's JSON, with its `id`): no store parses limits.
Every write raises the version by one and records, per override touched, the document before and
after, so any version within the last `HISTORY` can be rebuilt (`documents_at`) and a rollback is
one more change. `MemoryOverrideStore` is the reference every store is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

HISTORY = 100  # changes kept, newest first
Document = Mapping[str, object]  # one override as the admin API shows it, with its "id"
Touched = tuple[str, Document | None, Document | None]  # id, before, after (None: absent)


class UnknownVersion(LookupError):
    """A rollback to a version the history no longer reaches (or never was)."""


@dataclass(frozen=True, slots=True)
class OverrideSnapshot:
    version: int
    documents: Mapping[str, Document]


@dataclass(frozen=True, slots=True)
class Change:
    """`action`: "put", "delete" or "rollback"."""

    version: int
    time_ms: int
    action: str
    touched: tuple[Touched, ...]


class OverrideStore(Protocol):
    """Writes raise `StoreError` when the store is unreachable (the admin API answers 503)."""

    @property
    def description(self) -> str: ...

    async def read(self) -> OverrideSnapshot: ...

    async def put(self, document: Document, now_ms: int) -> int: ...

    async def delete(self, override_id: str, now_ms: int) -> int | None:
        """None (no new version) if there is none."""
        ...

    async def history(self) -> tuple[Change, ...]: ...

    async def rollback(self, version: int, now_ms: int) -> int:
        """Raises UnknownVersion."""
        ...

    async def close(self) -> None: ...


def documents_at(
    current: Mapping[str, Document], version: int, changes: Sequence[Change]
) -> dict[str, Document]:
    """Undo the changes after `version` (newest first); UnknownVersion if they do not reach back."""
    latest = changes[0].version if changes else 0
    oldest_known = changes[-1].version - 1 if changes else latest
    if version > latest or version < oldest_known or version < 0:
        raise UnknownVersion(f"version {version} is not in the last {HISTORY} changes")
    documents = dict(current)
    for change in changes:
        if change.version <= version:
            break
        for override_id, before, _after in change.touched:
            if before is None:
                documents.pop(override_id, None)
            else:
                documents[override_id] = before
    return documents


def change_of(record: Any) -> Change:
    """A change as the stores keep it in JSON: {"version", "time_ms", "action", "touched"}."""
    touched = tuple((str(i), before, after) for i, before, after in record["touched"])
    return Change(int(record["version"]), int(record["time_ms"]), str(record["action"]), touched)


def rollback_touches(
    current: Mapping[str, Document], target: Mapping[str, Document]
) -> tuple[Touched, ...]:
    ids = sorted(set(current) | set(target))
    return tuple((i, current.get(i), target.get(i)) for i in ids if current.get(i) != target.get(i))


class MemoryOverrideStore:
    description = "memory"

    def __init__(self) -> None:
        self.version = 0
        self.documents: dict[str, Document] = {}
        self.changes: list[Change] = []  # newest first

    async def read(self) -> OverrideSnapshot:
        return OverrideSnapshot(self.version, dict(self.documents))

    async def put(self, document: Document, now_ms: int) -> int:
        override_id = str(document["id"])
        before = self.documents.get(override_id)
        return self._apply("put", ((override_id, before, dict(document)),), now_ms)

    async def delete(self, override_id: str, now_ms: int) -> int | None:
        before = self.documents.get(override_id)
        if before is None:
            return None
        return self._apply("delete", ((override_id, before, None),), now_ms)

    async def history(self) -> tuple[Change, ...]:
        return tuple(self.changes)

    async def rollback(self, version: int, now_ms: int) -> int:
        target = documents_at(self.documents, version, self.changes)
        return self._apply("rollback", rollback_touches(self.documents, target), now_ms)

    async def close(self) -> None:
        return None

    def _apply(self, action: str, touched: tuple[Touched, ...], now_ms: int) -> int:
        """Stores that persist override this to write out before answering."""
        for override_id, _before, after in touched:
            if after is None:
                self.documents.pop(override_id, None)
            else:
                self.documents[override_id] = after
        self.version += 1
        self.changes.insert(0, Change(self.version, now_ms, action, touched))
        del self.changes[HISTORY:]
        return self.version
