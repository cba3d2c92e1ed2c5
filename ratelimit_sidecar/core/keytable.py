"""A bounded table of tracked keys, so a flood of random descriptor values cannot exhaust memory."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from itertools import islice

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import KeyId

EVICTION_PROBES = 16  # the oldest entries looked at for an evictable one


class KeyTable:
    """Blocked keys are never evicted: a flood of new values cannot unblock an abuser (the caller
    keeps evicted counts)."""

    __slots__ = ("_states", "evictions", "get", "max_keys", "removals")

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        # Ordered: a plain dict's iteration skips every deleted entry, slowing evictions.
        self._states: OrderedDict[KeyId, KeyState] = OrderedDict()
        # Bound once: the request path calls it for every descriptor.
        self.get: Callable[[KeyId], KeyState | None] = self._states.get
        self.evictions = 0
        self.removals = 0

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[KeyState]:
        return iter(list(self._states.values()))

    @property
    def added(self) -> int:
        """Keys ever inserted, for an index beside the table to see it changed."""
        return len(self._states) + self.evictions + self.removals

    def newest_first(self) -> Iterator[KeyId]:
        """Not to be held across a change of the table."""
        return reversed(self._states)

    def insert(self, state: KeyState, now_ms: int) -> list[KeyState] | None:
        """The evicted states (maybe none), or None if there was no room."""
        evicted: list[KeyState] = []
        if len(self._states) >= self.max_keys:
            victim = self._find_victim(now_ms)
            if victim is None:
                return None
            self._states.pop(victim.key).tracked = False
            self.evictions += 1
            evicted.append(victim)
        self._states[state.key] = state
        state.tracked = True
        return evicted

    def remove(self, state: KeyState) -> None:
        """Unless its key is tracked anew (a caller working in slices may hold an evicted state)."""
        if self._states.get(state.key) is state:
            self._states.pop(state.key).tracked = False
            self.removals += 1

    def _find_victim(self, now_ms: int) -> KeyState | None:
        """The first of the oldest keys idle in its window (busy and blocked ones go to the back),
        else the unblocked one with the fewest admitted hits."""
        oldest = list(islice(self._states.values(), EVICTION_PROBES))
        for state in oldest:
            idle = now_ms - state.last_hit >= state.limit.window_ms
            if idle and now_ms >= state.blocked_until:
                return state
            self._states.move_to_end(state.key)
        unblocked = [s for s in oldest if now_ms >= s.blocked_until]
        return min(unblocked, key=lambda s: s.nodes.admitted, default=None)

    def busiest(self, limit: int) -> list[KeyState]:
        states = sorted(self._states.values(), key=lambda s: s.nodes.admitted, reverse=True)
        return states[:limit]
