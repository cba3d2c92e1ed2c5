"""What a decision rule provides, so the limiter runs any rule the same way.

The limiter owns the key table, span bookkeeping and the order of events; an algorithm owns what
the counts mean (admission, the answer, what a store's answer does) and the key's `counts`.
Base classes rather than Protocols: the limiter calls them on every decision, and the compiled
build calls a base class's methods directly (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push, PushResult, Verdict


class Algorithm:
    __slots__ = ()

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` (0: none): the key's count in its window before eviction (core/evicted.py)."""
        raise NotImplementedError

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        """For an unblocked key: None if `hits` more are admitted, else the refusal (shadow: OK)."""
        raise NotImplementedError

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        """A refusal's Retry-After from the counts this node knows; never before the block ends."""
        raise NotImplementedError

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Negative hits give quota back."""
        raise NotImplementedError

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        raise NotImplementedError

    def window_count(self, state: KeyState) -> int:
        """What an evicted key leaves behind for `start`."""
        raise NotImplementedError


class SharedAlgorithm(Algorithm):
    """Counts a shared store can sum (all but the sliding log)."""

    __slots__ = ()

    def store_answer(
        self, state: KeyState, push: Push, answer: PushResult | None, now_ms: int
    ) -> bool:
        """The store's answer, or None (failed: the fallback decides); True if it blocks the key."""
        raise NotImplementedError
