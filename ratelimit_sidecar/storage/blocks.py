"""Blocks announced by Redis: the message the scripts publish, and which tracked key it names.

A script starting a block (sync_common.lua `start_block`, strict.lua) publishes on
`KeySchema.channel(BLOCKS)` `<digest>|<left_ms>|<level>|<set_for>[|more fields...]`: the key's
digest (keys.py), the flag's PX (relative: clock skew does not matter), the penalty level it
started with (0: none), the requests per unit it was started for (`lifts_block`; 0: not known).
Readers ignore fields they do not know, so later versions can add some.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ratelimit_sidecar.core.keytable import KeyTable
from ratelimit_sidecar.core.types import KeyId
from ratelimit_sidecar.storage.keys import DIGEST_HEX, digest

BLOCKS = "blocks"  # the channel name, under the deployment's prefix (KeySchema.channel)
NEAR = "near"  # where sync.lua announces a window that came near its limit: parse_near
MAX_MESSAGE = 256  # bytes: anything longer is not ours
STALE_SLACK = 1024  # index entries allowed beyond twice the table before a rebuild
MAX_CATCH_UP = 500  # new keys one lookup may hash (1-5 ms); beyond, a rebuild in slices
REBUILD_STEP = 500  # keys a rebuild hashes between two yields to the event loop
_DIGEST = re.compile(rb"[0-9a-f]{%d}" % DIGEST_HEX)


class BlockNotice(NamedTuple):
    digest: str
    left_ms: int
    level: int
    set_for: int = 0  # the limit's requests per unit the block was started for; 0: not known


def parse_notice(data: bytes) -> BlockNotice | None:
    """The notice in `data`, or None if it is not one (a reader must survive any message)."""
    fields = data.split(b"|")
    if len(data) > MAX_MESSAGE or len(fields) < 3 or not _DIGEST.fullmatch(fields[0]):
        return None
    try:
        left_ms, level = int(fields[1]), int(fields[2])
        set_for = int(fields[3]) if len(fields) > 3 else 0
    except ValueError:
        return None
    if left_ms <= 0 or level < 0 or set_for < 0:
        return None
    return BlockNotice(fields[0].decode("ascii"), left_ms, level, set_for)


class DigestIndex:
    """Which tracked key has a given digest, off the request path. Filled lazily: a missed lookup
    hashes the keys the table took in since the last, newest first, so each key is hashed about
    once. Past MAX_CATCH_UP new keys, or too many of keys gone: `rebuild_wanted`, and the caller
    runs `rebuild_steps` between requests. Memory: about twice the table."""

    def __init__(self, table: KeyTable, name: Callable[[KeyId], str] = digest) -> None:
        self._table = table
        self._name = name
        self._keys: dict[str, KeyId] = {}
        self._added_seen = 0  # table.added when the index last caught up with it
        self.rebuild_wanted = False

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, name: str) -> KeyId | None:
        key = self._keys.get(name)
        if key is None and self._table.added != self._added_seen:
            self._catch_up()
            key = self._keys.get(name)
        if key is None or self._table.get(key) is None:
            return None
        return key

    def _catch_up(self) -> None:
        added = self._table.added
        new = added - self._added_seen
        if new > MAX_CATCH_UP or len(self._keys) > 2 * len(self._table) + STALE_SLACK:
            self.rebuild_wanted = True
            return
        found = 0
        for looked, key in enumerate(self._table.newest_first()):
            if found >= new:
                break
            if looked >= 2 * MAX_CATCH_UP:  # new keys evicted meanwhile, or moved ones
                self.rebuild_wanted = True
                return
            name = self._name(key)
            if self._keys.get(name) != key:
                self._keys[name] = key
                found += 1
        self._added_seen = added

    def rebuild_steps(self, keys_per_step: int = REBUILD_STEP) -> Iterator[int]:
        """Index the table anew in slices; the old index serves until it is done."""
        added, keys = self._table.added, list(self._table.newest_first())
        fresh: dict[str, KeyId] = {}
        for index, key in enumerate(keys):
            fresh[self._name(key)] = key
            if index % keys_per_step == keys_per_step - 1:
                yield index + 1
        self._keys, self._added_seen, self.rebuild_wanted = fresh, added, False


class NearNotice(NamedTuple):
    """A fixed window's count reached NEAR_SHARE of MAX: `<digest>|<window>|<total>[|e]`, `e`
    for a push at the edge (core/edge.py)."""

    digest: str
    window: int
    total: int
    edge: bool = False


def parse_near(data: bytes) -> NearNotice | None:
    fields = data.split(b"|")
    if len(data) > MAX_MESSAGE or len(fields) < 3 or not _DIGEST.fullmatch(fields[0]):
        return None
    try:
        window, total = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    edge = len(fields) > 3 and fields[3] == b"e"
    return NearNotice(fields[0].decode("ascii"), window, total, edge) if total > 0 else None
