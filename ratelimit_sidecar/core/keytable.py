"""A bounded table of tracked keys, so a flood of random descriptor values cannot exhaust memory."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from itertools import islice

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import KeyId

# How many of the oldest entries to look at for an evictable one before giving up.
EVICTION_PROBES = 16


class KeyTable:
    """Keys in insertion order; when full, an old key not hit in its current window makes room,
    else the busy one with the smallest count (see _find_victim).

    Evicted keys are returned to the caller, which keeps what they counted: eviction loses
    tracking precision, never counts. Blocked keys are never evicted for room, so flooding new
    values cannot unblock an abuser.
    """

    __slots__ = ("_states", "evictions", "get", "max_keys", "removals")

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        # Ordered, so that finding the oldest keys costs the same after any number of
        # evictions: a plain dict skips over every entry deleted before it when iterated.
        self._states: OrderedDict[KeyId, KeyState] = OrderedDict()
        # The dict's own lookup, bound once: the request path calls it for every descriptor.
        self.get: Callable[[KeyId], KeyState | None] = self._states.get
        self.evictions = 0
        self.removals = 0

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[KeyState]:
        return iter(list(self._states.values()))

    @property
    def added(self) -> int:
        """Keys ever inserted: what an index beside the table compares to see that it changed
        (computed, so that inserting a key costs nothing more)."""
        return len(self._states) + self.evictions + self.removals

    def newest_first(self) -> Iterator[KeyId]:
        """Tracked keys, the last inserted (or moved to the back) first. Not to be held across
        a change of the table."""
        return reversed(self._states)

    def insert(self, state: KeyState, now_ms: int) -> list[KeyState] | None:
        """Track `state`; returns the evicted states (maybe empty), or None if there was no room."""
        evicted: list[KeyState] = []
        if len(self._states) >= self.max_keys:
            victim = self._find_victim(now_ms)
            if victim is None:
                return None
            del self._states[victim.key]
            self.evictions += 1
            evicted.append(victim)
        self._states[state.key] = state
        return evicted

    def remove(self, state: KeyState) -> None:
        """Forget `state`, unless its key is tracked by another state by now (a caller working
        in slices may hold a state evicted, and its key tracked anew, in between)."""
        if self._states.get(state.key) is state:
            del self._states[state.key]
            self.removals += 1

    def _find_victim(self, now_ms: int) -> KeyState | None:
        """Among the EVICTION_PROBES oldest keys, the first one idle in its current window; the
        busy and blocked ones looked at go to the back (a second chance, so a key in steady use
        is not evicted just for being old). If all are busy, the unblocked one this node
        admitted the fewest hits for in its window (its count is kept, see core/evicted.py)."""
        oldest = list(islice(self._states.values(), EVICTION_PROBES))
        for state in oldest:
            idle = now_ms - state.last_hit >= state.limit.window_ms
            if idle and now_ms >= state.blocked_until:
                return state
            self._states.move_to_end(state.key)
        unblocked = [s for s in oldest if now_ms >= s.blocked_until]
        return min(unblocked, key=lambda s: s.nodes.admitted, default=None)

    def busiest(self, limit: int) -> list[KeyState]:
        """The keys with the most local hits in their current window, for /debug/keys."""
        states = sorted(self._states.values(), key=lambda s: s.nodes.admitted, reverse=True)
        return states[:limit]
