"""What a decision rule provides, so the limiter runs any rule the same way.

The limiter owns the key table, span bookkeeping and the order of events; the nodes estimate is the
key's own. An algorithm owns what the counts mean: admission, the answer, and what a span end does
with the store's answer, without it (failed), or with no store (local-only). Its state is the key's
`counts`, made in `start`.
"""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push, PushResult, Verdict


class Algorithm(Protocol):
    # -- a key and a request -----------------------------------------------------------------

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` (0: none): what the key counted in its window before eviction
        (core/evicted.py)."""
        ...

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        """None if `hits` more are admitted on an unblocked key; else the refusal (a shadow rule's:
        OK, marked). A block refuses before any algorithm looks."""
        ...

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        """A refusal's Retry-After from the counts this node knows; never before the block ends."""
        ...

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Negative hits give quota back."""
        ...

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        """The OK answer after the request's own hits."""
        ...

    def window_count(self, state: KeyState) -> int:
        """What an evicted key leaves behind for `start`."""
        ...

    def close_span(self, state: KeyState, end_ms: int) -> None:
        """Local-only mode: the span's `pending` hits are the fleet's."""
        ...


class SharedAlgorithm(Algorithm, Protocol):
    """Counts a shared store can sum (all but the sliding log)."""

    def store_answer(
        self, state: KeyState, push: Push, answer: PushResult | None, now_ms: int
    ) -> bool:
        """The store's answer to the span's push, or None (the push failed: the fallback decides).
        True if it blocks the key."""
        ...
