"""What a decision rule must provide, so the limiter can run any rule the same way.

The limiter owns the key table, the span bookkeeping (what is pending, in flight or unsent for
which window) and the order of events; the nodes estimate is the key's own
(core/nodes_estimate.py); an algorithm owns what the counts mean: whether a request is admitted,
what the answer says, and what a span end does to a key, with the store's answer, without it
(the store failed), or with no store at all (local-only mode). Its own state is the key's
`counts`, which it makes in `start`.
"""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push, PushResult, Verdict


class Algorithm(Protocol):
    # -- a key and a request -----------------------------------------------------------------

    def start(self, state: KeyState, resumed: int) -> None:
        """A key new to the node: make its `counts`; `resumed` (0: none) is what it counted in
        its current window before it was evicted (core/evicted.py)."""
        ...

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        """None if `hits` (> 0) more are admitted on a key under no block; else the verdict
        that refuses them (or, for a shadow rule, the OK verdict that says they would have
        been refused). A block refuses before any algorithm looks (`Limiter`)."""
        ...

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        """A refusal's Retry-After: how long until a retry of `hits` is admitted if the counts
        are as this node knows them; never before the key's block ends."""
        ...

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Record admitted hits (negative hits give quota back)."""
        ...

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        """The OK answer after the request's own hits: what remains, when it resets."""
        ...

    def window_count(self, state: KeyState) -> int:
        """The key's count in its current window, as far as this node knows it (what an
        evicted key leaves behind for `start`)."""
        ...

    def close_span(self, state: KeyState, end_ms: int) -> None:
        """Local-only mode: the span that ended at `end_ms` counts for this node alone (its
        `pending` hits are the fleet's)."""
        ...


class SharedAlgorithm(Algorithm, Protocol):
    """An algorithm whose counts a shared store can sum (every one but the sliding log)."""

    def store_answer(
        self, state: KeyState, push: Push, answer: PushResult | None, now_ms: int
    ) -> bool:
        """The store's answer to this node's push of the key's span (its total, and whatever
        else the algorithm's store script returns), or None: the push of this span's hits
        failed, and the fallback decides alone. True if it blocks the key."""
        ...
