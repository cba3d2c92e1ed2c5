"""What a decision rule must provide, so the limiter can run any rule the same way.

The limiter owns the key table, the span bookkeeping (what is pending, in flight or unsent for
which window) and the order of events; an algorithm owns what those counts mean: whether a
request is admitted, what the answer says, and what a span end does to a key, with the store's
answer, without it (the store failed), or with no store at all (local-only mode).
"""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push, PushResult, Verdict


class Algorithm(Protocol):
    # -- a request ---------------------------------------------------------------------------

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        """None if `hits` more are admitted; else the verdict that refuses them (or, for a
        shadow rule, the OK verdict that says they would have been refused)."""
        ...

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Record admitted hits (negative hits give quota back)."""
        ...

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        """The OK answer after the request's own hits: what remains, when it resets."""
        ...

    def untracked(self, limit: RateLimit, hits: int, shadow: bool, now_ms: int) -> Verdict:
        """The answer when no counter can be kept (the key table is full of blocked keys)."""
        ...

    # -- eviction ----------------------------------------------------------------------------

    def window_count(self, state: KeyState) -> int:
        """The key's count in its current window, as far as this node knows it."""
        ...

    def resume(self, state: KeyState, count: int) -> None:
        """A key back in the window it was evicted from, where it had counted `count`."""
        ...

    # -- a span end --------------------------------------------------------------------------

    def close_span(self, state: KeyState, end_ms: int) -> None:
        """Local-only mode: the span that ended at `end_ms` counts for this node alone."""
        ...

    def store_answer(self, state: KeyState, push: Push, answer: PushResult, now_ms: int) -> bool:
        """The store's answer to this node's push for the key's current window (its total,
        and whatever else the algorithm's store script returns); True if it blocks."""
        ...

    def store_failed(self, state: KeyState, count: int, now_ms: int) -> bool:
        """The push of this span's `count` hits failed; True if the fallback blocks the key."""
        ...

    def learn_nodes(self, state: KeyState, window: int, total: int, live_nodes: int) -> None:
        """The fleet's total of a finished window, to learn how many nodes share the key
        (`live_nodes`: the store's heartbeat count, 0 if unknown)."""
        ...

    def after_sync(self, state: KeyState, sync_ms: int) -> None:
        """Every answer of the sync is in (totals and nodes): adjust the request check."""
        ...

    def after_failure(self, state: KeyState) -> None:
        """The store did not answer: decide without what only the store could tell."""
        ...

    def set_nodes(self, state: KeyState, nodes: float) -> None:
        """Take a new estimate of how many nodes share the key."""
        ...
