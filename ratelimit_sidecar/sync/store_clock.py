"""The span clock: the local clock, corrected to the shared store's clock (Redis `TIME`).

Spans and windows are epoch-aligned, so nodes agree on them only as well as their clocks agree.
Every sync reads the store's time in the same pipeline as the pushes; the offset between the
store's clock and the local one is estimated as NTP does, assuming the reply came back halfway
through the round trip (the error is at most half the round trip). docs/ACCURACY.md, variant (b),
measured this: without the half round trip, every node lags the store by it.

Reading the clock stays one local call plus an addition: the request path never waits for the
store. Until the store has answered (and in local-only mode, or with a store that does not
report its time) the offset is 0: the local clock. While the store is down the last offset is
kept: clocks drift by milliseconds per hour, and switching back would move every span.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SAMPLES = 8  # recent syncs; the one with the shortest round trip gives the offset
MAX_HOLD_MS = 1000  # a smaller step back is absorbed by holding the clock; a larger one jumps


def monotonic_wall_ms() -> int:
    """Epoch milliseconds that never step: the monotonic clock, set to the wall clock once."""
    return time.monotonic_ns() // 1_000_000 + _MONO_TO_WALL_MS


_MONO_TO_WALL_MS = time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000


class StoreClock:
    """`now_ms()` = local clock + the store's offset; small corrections never run it back."""

    __slots__ = ("_floor", "_monotonic_ns", "_offset", "_samples", "_shift", "local_ms")

    def __init__(self, local_ms: Callable[[], int] = monotonic_wall_ms) -> None:
        self.local_ms = local_ms
        # Every decision reads this clock: the usual local clock is read here, one call less,
        # through an attribute rather than `time.`'s lookup by name (docs/PERFORMANCE.md).
        usual = local_ms is monotonic_wall_ms
        self._monotonic_ns: Callable[[], int] | None = time.monotonic_ns if usual else None
        self._offset = self._shift = 0
        self.offset_ms = 0
        self._floor = 0  # the latest time handed out before the offset last went down
        self._samples: deque[tuple[int, int]] = deque(maxlen=SAMPLES)  # (round trip, offset)

    @property
    def offset_ms(self) -> int:
        return self._offset

    @offset_ms.setter
    def offset_ms(self, offset: int) -> None:
        self._offset = offset
        self._shift = _MONO_TO_WALL_MS + offset  # monotonic ms -> store ms

    def now_ms(self) -> int:
        monotonic_ns = self._monotonic_ns
        if monotonic_ns is not None:
            now = monotonic_ns() // 1_000_000 + self._shift
        else:
            now = self.local_ms() + self._offset
        return now if now >= self._floor else self._floor

    def observe(self, sent_ms: int, received_ms: int, store_ms: int) -> None:
        """A store reply read at `store_ms` (store clock), for a call sent and answered at the
        given local times. Ignored if the local clock went back meanwhile."""
        rtt = received_ms - sent_ms
        if rtt < 0 or store_ms <= 0:
            return
        self._samples.append((rtt, store_ms + rtt // 2 - received_ms))
        offset = min(self._samples)[1]
        if 0 < self.offset_ms - offset <= MAX_HOLD_MS:
            # A small correction back (round-trip noise): hold the clock until it catches up
            # rather than run it backwards. A large one (the first sync of a node whose clock
            # is off, a stepped clock) is applied at once: holding would stall the spans.
            self._floor = max(self._floor, self.local_ms() + self.offset_ms)
        self.offset_ms = offset
