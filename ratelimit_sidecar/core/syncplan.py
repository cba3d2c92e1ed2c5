"""One span end's batch and how its answer (or its failure) changes the keys it covered."""

from __future__ import annotations

from ratelimit_sidecar.core.algorithm import Algorithm
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Push, SyncBatch, SyncResult, SyncStats, TotalRead


class SyncPlan:
    """A `SyncBatch` plus the key states each of its entries belongs to.

    The batch is what the store sees; the states stay here so applying the answer needs no
    lookups, and a key evicted meanwhile is updated harmlessly instead of recreated. What the
    answer means for a key is the algorithm's business; the bookkeeping (what was in flight,
    what waits for a resend) is done here.
    """

    __slots__ = ("_algorithm", "_fresh", "_push_states", "_total_states", "batch")

    def __init__(self, now_ms: int, algorithm: Algorithm) -> None:
        self.batch = SyncBatch(now_ms)
        self._algorithm = algorithm
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
        algorithm, blocked = self._algorithm, 0
        pushes = zip(self.batch.pushes, self._push_states, result.pushes, strict=True)
        for push, state, answer in pushes:
            if state is None:
                continue
            # A late push for a finished window: its total no longer gates requests.
            if push.window == state.window:
                state.inflight = 0
                blocked += algorithm.store_total(state, answer.total, now_ms)
            if answer.block_ms > 0:
                state.block(now_ms + answer.block_ms)
        reads = zip(self.batch.total_reads, self._total_states, result.totals, strict=True)
        for read, state, total in reads:
            algorithm.learn_nodes(state, read.window, total)
        for push, state in zip(self.batch.pushes, self._push_states, strict=True):
            if state is not None and push.window == state.window:
                algorithm.after_sync(state, self.batch.now_ms)  # `seen` and `nodes` are new
        hits = sum(p.count for p in self.batch.pushes)
        return SyncStats(len(self.batch.pushes), hits, 0, blocked)

    def fail(self, now_ms: int, resend: bool = True) -> SyncStats:
        """The store did not answer: keep the deltas for the next push and apply the fallback."""
        algorithm, dropped, blocked = self._algorithm, 0, 0
        pushes = zip(self.batch.pushes, self._push_states, self._fresh, strict=True)
        for push, state, fresh in pushes:
            if state is None:
                dropped += push.count  # an evicted key's hits have nowhere to wait
                continue
            algorithm.after_failure(state)
            # Retried hits were judged in their own span: never count them twice.
            if fresh and push.window == state.window:
                state.inflight = 0
                blocked += algorithm.store_failed(state, push.count, now_ms)
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
