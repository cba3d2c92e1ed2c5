"""One span end's batch and how its answer (or its failure) changes the keys it covered."""

from __future__ import annotations

from typing import cast

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core import types
from ratelimit_sidecar.core.algorithm import Algorithm, SharedAlgorithm
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState


class SyncPlan:
    """A `SyncBatch` plus each entry's key state: no lookups, and a key evicted meanwhile is
    updated harmlessly, not recreated. Here the bookkeeping; the answer's meaning elsewhere."""

    __slots__ = (
        "_algorithms",
        "_fresh",
        "_paced",
        "_push_states",
        "_total_states",
        "batch",
        "requeue",
    )

    def __init__(self, now_ms: int, algorithms: tuple[Algorithm, ...]) -> None:
        self.batch = types.SyncBatch(now_ms)
        self._algorithms = algorithms  # indexed by AlgorithmName
        paced = algorithms[AlgorithmName.FIXED_WINDOW]
        assert isinstance(paced, FixedWindow)
        self._paced = paced
        self._push_states: list[KeyState | None] = []
        self.requeue: list[types.Push] = []  # pushes of keys no longer tracked, to send again
        self._fresh: list[bool] = []  # the push carries this span's hits (not a retry)
        self._total_states: list[KeyState] = []

    def push(self, state: KeyState | None, push: types.Push, fresh: bool = True) -> None:
        self.batch.pushes.append(push)
        self._push_states.append(state)
        self._fresh.append(fresh and state is not None)

    def read_total(self, state: KeyState, read: types.TotalRead) -> None:
        self.batch.total_reads.append(read)
        self._total_states.append(state)

    def succeed(self, now_ms: int, result: types.SyncResult) -> types.SyncStats:
        """A push answered as not applied fails alone, as in `fail`, and is resent."""
        pushed = hits = dropped = blocked = failed_orphans = edge = 0
        failed: set[KeyState] = set()  # keys whose push failed: their pace is unknown
        paced: list[KeyState] = []  # fixed windows that synced: they pace their check
        rows = zip(self.batch.pushes, self._push_states, self._fresh, result.pushes, strict=True)
        for push, state, fresh, answer in rows:
            if answer.error:
                lost, blocks = self._fail_push(now_ms, push, state, fresh, resend=True)
                dropped, blocked = dropped + lost, blocked + blocks
                failed_orphans += state is None
                if state is not None:
                    failed.add(state)
                continue
            pushed, hits, edge = pushed + 1, hits + push.hits, edge + push.edge
            if state is not None:
                blocked += self._take_answer(now_ms, push, state, answer)
                if push.window == state.window and _paced(state):
                    paced.append(state)
        self._learn_nodes(result)
        for state in paced:  # once totals and nodes are in
            if state not in failed:
                self._paced.after_sync(state, self.batch.now_ms, True)
        failed_keys = len(failed) + failed_orphans
        reads = len(self.batch.total_reads)
        return types.SyncStats(
            pushed,
            hits,
            dropped,
            blocked,
            failed_keys=failed_keys,
            read_keys=reads,
            edge_pushes=edge,
        )

    def _take_answer(
        self, now_ms: int, push: types.Push, state: KeyState, answer: types.PushResult
    ) -> bool:
        if push.window == state.window:
            state.inflight = 0
        # Even a late push may be news: a sliding window's spans and a bucket's debt outlive
        # their window.
        if answer.level >= 0 and state.penalty is not None:  # first: blocks below use it
            state.penalty.take_store(now_ms, answer.level, answer.block_level, answer.block_ms)
        blocks = self._algorithm(state).store_answer(state, push, answer, now_ms)
        if answer.block_ms > 0:
            state.block(now_ms + answer.block_ms)
        return blocks

    def _learn_nodes(self, result: types.SyncResult) -> None:
        reads = zip(self.batch.total_reads, self._total_states, result.totals, strict=True)
        for read, state, total in reads:
            state.nodes.learn(read.window, total, result.live_nodes)

    def fail(self, now_ms: int, resend: bool = True) -> types.SyncStats:
        """`resend` False: the batch may have been applied: its counts are dropped, not resent."""
        dropped = blocked = 0
        for push, state, fresh in zip(
            self.batch.pushes, self._push_states, self._fresh, strict=True
        ):
            lost, blocks = self._fail_push(now_ms, push, state, fresh, resend)
            dropped, blocked = dropped + lost, blocked + blocks
        return types.SyncStats(0, 0, dropped, blocked, failed=True)

    def _fail_push(
        self, now_ms: int, push: types.Push, state: KeyState | None, fresh: bool, resend: bool
    ) -> tuple[int, bool]:
        """(hits dropped, key blocked)."""
        if state is None:  # an evicted key's hits: sent again with the next batch if they can be
            recent = now_ms // push.limit.window_ms - push.window <= 1
            if resend and recent:
                self.requeue.append(push)
                return 0, False
            return push.hits, False
        if _paced(state):
            self._paced.after_sync(state, now_ms, False)
        blocks = False
        # Retried hits were judged in their own span: never count them twice.
        if fresh and push.window == state.window:
            state.inflight = 0
            blocks = self._algorithm(state).store_answer(state, push, None, now_ms)
        if resend:
            return state.stash(push.hits, push.window, state.window), blocks
        return push.hits, blocks  # may have arrived: counted as unconfirmed, not resent

    def _algorithm(self, state: KeyState) -> SharedAlgorithm:
        name = state.limit.algorithm
        assert name is not AlgorithmName.SLIDING_LOG, "never pushed (core/sliding_log.py)"
        return cast(SharedAlgorithm, self._algorithms[name])

    def answers(self, result: types.SyncResult) -> bool:
        got = (len(result.pushes), len(result.totals))
        return got == (len(self.batch.pushes), len(self.batch.total_reads))

    def states(self) -> list[KeyState]:
        return [state for state in self._push_states if state is not None]


def _paced(state: KeyState) -> bool:
    return state.limit.algorithm is AlgorithmName.FIXED_WINDOW
