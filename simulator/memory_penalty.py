"""The in-process store's half of progressive penalties: what sync_common.lua does in Redis.

Per penalised key: its level (expiring `forgive_after` after the last offence reported) and its
block flag with the level the block started at. The rule itself is core/penalty.py's.
"""

from __future__ import annotations

from ratelimit_sidecar.core.penalty import block_ms, flag_level
from ratelimit_sidecar.core.types import KeyId, Push, PushResult
from ratelimit_sidecar.storage import shared_rules as rules


class Penalties:
    """Levels and block flags of the penalised keys of one `MemoryStorage`."""

    def __init__(self) -> None:
        self._levels: dict[KeyId, tuple[int, int]] = {}  # -> (level, expires)
        # -> (expires, the block's level, the requests per unit it was set for)
        self._flags: dict[KeyId, tuple[int, int, int]] = {}

    def push(self, push: Push, total: int, spans: tuple[int, ...], now: int) -> PushResult:
        """The answer to a penalised key's push: sync_common.lua `penalised`."""
        limit, penalty = push.limit, push.limit.penalty
        assert penalty is not None
        level = self._level(push, now)
        expires, at, set_for = self._flags.get(push.key, (0, 0, 0))
        if expires > now and rules.lifted(set_for, limit):  # raised since: deleted
            del self._flags[push.key]
            expires = 0
        if rules.blocks(limit, total) and expires <= now:
            at = flag_level(level, push.blocking_level)
            expires = now + block_ms(limit.cooldown, penalty, at)
            self._flags[push.key] = (expires, at, limit.requests_per_unit)
        left = max(0, expires - now)
        return PushResult(total, left, "", spans, level, at if left else 0)

    def _level(self, push: Push, now: int) -> int:
        """The level after this push's report: the highest asked for, renewed by any report."""
        assert push.limit.penalty is not None
        level, expires = self._levels.get(push.key, (0, 0))
        level = level if now < expires else 0
        if push.wanted_level > 0:
            level = max(level, push.wanted_level)
            self._levels[push.key] = (level, now + push.limit.penalty.forgive_after_ms)
        return level

    def purge(self, now: int) -> None:
        self._levels = {k: v for k, v in self._levels.items() if now < v[1]}
        self._flags = {k: v for k, v in self._flags.items() if now < v[0]}
