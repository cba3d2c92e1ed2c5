"""Local-only mode: one node with no store, whose own counts are the fleet's.

No span end visits a key: its hits are applied at the key's next use, as of the span's end, so a
block starts where a store's answer would have started it. `sweep` forgets unused keys.
"""

from __future__ import annotations

from collections.abc import Iterator

from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.limiter import KEYS_PER_STEP, Limiter
from ratelimit_sidecar.core.spans import span_end

# Kept a minute (or two windows) of silence so a returning client finds its counter.
IDLE_MS = 60_000
SWEEP_EVERY_MS = IDLE_MS // 4  # how often the server calls `sweep`


class LocalLimiter(Limiter):
    def _catch_up(self, state: KeyState, now_ms: int) -> None:
        limit = state.limit
        moved = now_ms // limit.window_ms != state.window
        if moved and now_ms >= state.next_sync + limit.cooldown:
            state.pending = state.unsent = 0  # a finished window; any block it set is over
        else:
            self._close(state, state.next_sync)
        state.next_sync = span_end(now_ms, limit.window_ms, limit.spans)
        if moved:
            self.dropped_hits += state.roll(now_ms)

    def _count_late(self, state: KeyState, hits: int) -> None:
        """Alone, a finished window's count is of no use."""

    def _evicted(self, state: KeyState) -> None:
        """Nobody else reads this node's counts."""

    def sweep(self, now_ms: int) -> None:
        for _ in self.sweep_steps(now_ms):
            pass

    def sweep_steps(self, now_ms: int, keys_per_step: int = KEYS_PER_STEP) -> Iterator[int]:
        """In slices, so an event loop answers requests in between (100,000 keys: tens of ms)."""
        for index, state in enumerate(self.keys):
            if now_ms - state.last_hit >= max(IDLE_MS, 2 * state.limit.window_ms):
                self._forget_if_done(state, now_ms)
            if index % keys_per_step == keys_per_step - 1:
                yield index + 1

    def _forget_if_done(self, state: KeyState, now_ms: int) -> None:
        if state.pending:  # its last span may still start a block
            self._close(state, state.next_sync)
        # A penalty level lives only here: the key stays until it is forgiven (core/penalty.py).
        penalised = state.penalty is not None and state.penalty.current_level(now_ms) > 0
        if state.settled(now_ms) and not penalised:
            self.keys.remove(state)

    def _close(self, state: KeyState, end_ms: int) -> None:
        """A span end without a round trip; a finished window's counts need no push."""
        state.roll(end_ms)  # leftovers of a finished window go to `unsent`, dropped below
        state.unsent = 0
        algorithm = self.algorithm_of(state)
        if state.pending and isinstance(algorithm, FixedWindow):
            algorithm.close_span(state, end_ms)
        state.pending = 0  # the other rules counted every hit where it belongs
