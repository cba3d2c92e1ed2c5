"""One span end's batch and how its answer (or its failure) changes the keys it covered."""

from __future__ import annotations

from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import (
    Push,
    SyncBatch,
    SyncResult,
    SyncStats,
    TotalRead,
)


class SyncPlan:
    """A `SyncBatch` plus the key states each of its entries belongs to.

    The batch is what the store sees; the states stay here so applying the answer needs no
    lookups, and a key evicted meanwhile is updated harmlessly instead of recreated.
    """

    __slots__ = ("_fresh", "_push_states", "_total_states", "batch")

    def __init__(self, now_ms: int) -> None:
        self.batch = SyncBatch(now_ms)
        self._push_states: list[KeyState | None] = []
        self._fresh: list[bool] = []  # the push carries this span's hits (not a retry)
        self._total_states: list[KeyState] = []

    def push(self, state: KeyState | None, push: Push, fresh: bool = True) -> None:
        self.batch.pushes.append(push)
        self._push_states.append(state)
        self._fresh.append(fresh and state is not None)

    def add_orphans(self, pushes: list[Push]) -> None:
        for push in pushes:
            self.push(None, push)

    def read_total(self, state: KeyState, read: TotalRead) -> None:
        self.batch.total_reads.append(read)
        self._total_states.append(state)

    def succeed(self, now_ms: int, result: SyncResult) -> SyncStats:
        """Take the store's totals and block flags in."""
        self._check_lengths(result)
        blocked = 0
        pushes = zip(self.batch.pushes, self._push_states, result.pushes, strict=True)
        for push, state, answer in pushes:
            if state is not None and _apply_push(state, push, answer.total, now_ms):
                blocked += 1
            if state is not None and answer.block_ms > 0:
                state.block(now_ms + answer.block_ms)
        for read, state, total in zip(
            self.batch.total_reads, self._total_states, result.totals, strict=True
        ):
            _estimate_nodes(state, read.window, total)
        for push, state in zip(self.batch.pushes, self._push_states, strict=True):
            if state is not None and push.window == state.window:
                state.tune(self.batch.now_ms)  # after `seen` and `nodes` are both new
        hits = sum(p.count for p in self.batch.pushes)
        return SyncStats(len(self.batch.pushes), hits, 0, blocked)

    def fail(self, now_ms: int, resend: bool = True) -> SyncStats:
        """The store did not answer: keep the deltas for the next push and apply the fallback.

        Fallback (seed concept 4 with the nodes extension): a key whose span count, scaled by
        its nodes estimate, exceeds its per-span share `MAX / N` is blocked for the cooldown.
        Its own span count is also folded into `seen`, so the request path keeps estimating
        the window's total while the store is away.
        """
        dropped = blocked = 0
        pushes = zip(self.batch.pushes, self._push_states, self._fresh, strict=True)
        for push, state, fresh in pushes:
            if state is None:
                dropped += push.count  # an evicted key's hits have nowhere to wait
                continue
            state.strict()
            if fresh:  # retried hits were judged in their own span: never count them twice
                blocked += _fallback(state, push, now_ms)
            if resend:
                dropped += state.stash(push.count, push.window, state.window)
            else:
                dropped += push.count  # may have arrived: counted as unconfirmed, not resent
        return SyncStats(0, 0, dropped, blocked, failed=True)

    def _check_lengths(self, result: SyncResult) -> None:
        got = (len(result.pushes), len(result.totals))
        want = (len(self.batch.pushes), len(self.batch.total_reads))
        if got != want:
            raise ValueError(f"sync result has {got} answers for {want} requests")


def _apply_push(state: KeyState, push: Push, total: int, now_ms: int) -> bool:
    """Record the window's global total; block if it is over. True if this blocked the key."""
    if push.window != state.window:
        return False  # a late push for a finished window: its total no longer gates requests
    state.inflight = 0
    state.seen = max(state.seen, total)
    if total > push.limit.requests_per_unit:
        # Re-armed at every span while the window stays over the limit: conservative on
        # purpose; honouring only the flag let more through after each block and broke the
        # MAX x (1 + 1/N) bound in the simulator (docs/ACCURACY.md).
        was_blocked = now_ms < state.blocked_until
        state.block(now_ms + push.limit.cooldown)
        return not was_blocked
    return False


def _fallback(state: KeyState, push: Push, now_ms: int) -> int:
    if push.window != state.window:
        return 0
    state.inflight = 0
    scaled = push.count * state.nodes
    state.seen += int(scaled)
    limit = push.limit
    if scaled > limit.requests_per_unit / limit.spans:
        state.block(now_ms + limit.cooldown)
        return 1
    return 0


def _estimate_nodes(state: KeyState, window: int, total: int) -> None:
    """nodes = the fleet's count / this node's count in a finished window (seed: Extension).

    Counted as *offered*: the hits this node rejected on its estimate alone are added to
    both sides. Admitted counts alone let a node's own rejections feed back: a node that
    rejected part of its traffic admitted less than its share, so it over-estimated `nodes`,
    which made it reject more (docs/ACCURACY.md, bug 2). Blocks from the store's total or the
    shared flag hit every node alike, so they do not skew the ratio and are not added.
    """
    rejected = state.estimate_rejected
    offered = state.estimate_local + rejected
    if window == state.estimate_window and offered > 0 and total > 0:
        state.set_nodes(max(1.0, (total + rejected) / offered))
    state.estimate_window = -1
