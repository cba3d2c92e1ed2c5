"""The fixed-window rule, counted in spans: at most MAX requests per window, for the whole fleet.

Windows are aligned on the epoch, so every node counts the same ones, each cut into N spans. A
node decides every request from memory and learns the fleet's count only at span ends, when it
pushes its span's hits to the shared store and reads back the window's total.

A request (`check`, then `count` and `admitted` when it is admitted):

1. A key under an active block is refused until the block ends (its Retry-After).
2. Otherwise the fleet's count is estimated as the store's last total (`seen`) plus this node's
   hits since, each standing for `nodes` nodes' worth of traffic. An estimate over the check's
   ceiling refuses this request alone, until the next sync. Only a count known to be over MAX
   (the store's total plus own hits, which no guess inflates) blocks for the cooldown. Either
   refusal's Retry-After is when a retry fits if the counts are as estimated (`retry_wait_ms`):
   the block's end, the window's end, or, while the window is over MAX, the end of the block
   its remaining syncs will set.
3. Admitted: the answer reports what is left of the window and when it resets.

A span end (with the store's answer, without it, or with no store at all):

- A store total over MAX blocks the key for the cooldown (again at every span while the window
  stays over: a window over the limit must not reopen after each block).
- The ceiling of step 2 is MAX, except while the window's pace projects a total under
  MAX x (1 + 1/N): then an estimate may pass MAX by the projection's distance to that bound, at
  most MAX / N, widened to the estimate's own noise on a node with a small share. A noisy
  estimate then no longer refuses requests of a window that ends under MAX, while a window on
  course past the bound keeps the strict check.
- The store failed: the span's own count, scaled by `nodes`, joins `seen`; over its share
  MAX / N it blocks the key for the cooldown. The ceiling goes back to MAX.
- Local-only mode: the span's hits join `seen` (the node is the fleet); a window over MAX
  blocks for the cooldown, as a store's total would.
- `nodes` is learnt from finished windows (core/nodes_estimate.py). While the ceiling is
  lenient, the check scales own hits by the lower of the last two estimates (`cautious`).

The switches `lenient`, `estimate_blocks` and `nodes_from_offered` turn parts of the rule off,
for the accuracy simulator's comparisons (simulator/variants.py, docs/ACCURACY.md); the sidecar
runs the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratelimit_sidecar.core.algorithm import SharedAlgorithm
from ratelimit_sidecar.core.edge import (
    at_edge,
    edge_from,
    estimate,
    others_since,
    push_due_ms,
    stale_after_block,
)
from ratelimit_sidecar.core.edge import ceiling as edge_ceiling
from ratelimit_sidecar.core.edge import enter as enter_edge
from ratelimit_sidecar.core.keystate import NEVER, KeyState, WindowCounts
from ratelimit_sidecar.core.quiet_keys import EarlySync
from ratelimit_sidecar.core.spans import window_end
from ratelimit_sidecar.core.types import OK, Push, PushResult, Verdict
from ratelimit_sidecar.core.verdicts import refusal, refuse_blocked

# A lenient ceiling is at least this many standard deviations of the noise in the estimate's
# extrapolation of one span of own hits (Poisson: sd = nodes x sqrt(hits/span)).
NOISE_SIGMAS = 3.0


@dataclass(frozen=True, slots=True)
class FixedWindow(SharedAlgorithm):
    early: EarlySync | None = None  # where a new key asks for its first push (core/fleet.py)
    lenient: bool = True  # False: the ceiling is always MAX
    estimate_blocks: bool = False  # True: an estimate over the ceiling blocks, as a known count
    nodes_from_offered: bool = True  # False: `nodes` learns from admitted counts only

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` may over-count: it refuses past the ceiling but starts no cooldown."""
        counts = WindowCounts(state.limit.requests_per_unit)
        counts.resumed = resumed
        state.counts = counts

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        counts = state.window_counts()
        unpushed = state.inflight + state.pending + hits
        # A key alone past an even share, or at the edge after a block: a push now.
        stale = (
            state.edge
            and counts.seen_ms < state.blocked_until
            and stale_after_block(state, unpushed, now_ms)
        )
        if unpushed > counts.early_at or stale:
            self._push_early(state, now_ms)
        if _over(state, counts, unpushed, now_ms):
            return self._estimate_over(state, hits, now_ms)
        return None

    def reported(self, state: KeyState, now_ms: int) -> None:
        """An RLQS report counted at the edge: past `early_at` own hits a key new here asks for
        its window's total at once, as `check` does for requests. A node that joined a window at
        MAX otherwise handed out shares of a count of 0 until its span end."""
        if state.inflight + state.pending > state.window_counts().early_at:
            self._push_early(state, now_ms)

    def _push_early(self, state: KeyState, now_ms: int) -> None:
        # Alone until the answer: the even split meanwhile only refused lone clients' bursts.
        state.window_counts().early_at = NEVER
        if self.early is not None:
            self.early.want(now_ms, state)
        else:
            state.next_sync = now_ms

    def _estimate_over(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        """Only a known count blocks (unless `estimate_blocks`): a noisy estimate must not block
        for a whole cooldown."""
        known = state.window_counts().seen + state.inflight + state.pending + hits
        if known > state.limit.requests_per_unit or self.estimate_blocks:
            return self._block(state, hits, now_ms)
        self._offered(state, hits)
        return refusal(state.limit, state.rule.shadow_mode, retry_wait_ms(state, hits, now_ms))

    def _block(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        state.block(_block_end(state, now_ms, now_ms // state.limit.window_ms))
        return refuse_blocked(state, hits, now_ms, retry_wait_ms(state, hits, now_ms))

    def _offered(self, state: KeyState, hits: int) -> None:
        """Refused on the estimate alone: offered all the same, which keeps `nodes` honest."""
        if self.nodes_from_offered:
            state.nodes.refused += hits

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        return retry_wait_ms(state, hits, now_ms)

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        if hits < 0:  # quota given back: never more than the window holds
            hits = max(hits, -(state.window_counts().seen + state.inflight + state.pending))
        state.counted(hits, now_ms)
        if state.edge and hits > 0:
            counts = state.window_counts()
            if counts.edge or counts.edge_from <= _estimate(state, counts):
                self._edge_hit(state, counts, now_ms)

    def count_leased(self, state: KeyState, hits: int, now_ms: int) -> None:
        """An RLQS lease's tokens (core/quota_lease.py): pushed at once and announced as a push at
        the edge, so every node's next lease sees them."""
        self.count(state, hits, now_ms)
        counts = state.window_counts()
        if not counts.edge:
            enter_edge(counts, state.limit)
        early = self.early
        if hits and early is not None and early.store_up:
            early.want(now_ms, state)

    def _edge_hit(self, state: KeyState, counts: WindowCounts, now_ms: int) -> None:
        """A hit of a key that may be at the edge: its push asked for (core/edge.py)."""
        early = self.early
        if early is None or not early.store_up:
            return
        due = now_ms  # on entering the edge: the others need these hits now
        if counts.edge:
            due = push_due_ms(state, counts, now_ms)
        else:
            threshold = edge_from(state, now_ms, early.live_nodes)
            if estimate(state, counts) < threshold:
                counts.edge_from = threshold  # no check until the estimate passes it
                return
            enter_edge(counts, state.limit)
        if due < state.next_sync:
            early.want(due, state)

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        counts = state.window_counts()
        used = counts.seen + counts.resumed + (state.inflight + state.pending) * state.nodes.value
        remaining = 0 if used >= rpu else rpu if used <= 0 else int(rpu - used)
        reset = limit.window_ms - now_ms % limit.window_ms  # until the window ends
        near = used >= limit.near_limit_ratio * rpu
        return Verdict(OK, limit, False, remaining, reset, False, state.rule.shadow_mode, near)

    def window_count(self, state: KeyState) -> int:
        counts = state.window_counts()
        return counts.seen + counts.resumed + state.inflight + state.pending

    def close_span(self, state: KeyState, end_ms: int) -> None:
        counts = state.window_counts()
        counts.seen, state.pending = counts.seen + state.pending, 0
        if counts.seen > state.limit.requests_per_unit:
            state.block(_block_end(state, end_ms, state.window))

    def store_answer(
        self, state: KeyState, push: Push, answer: PushResult | None, now_ms: int
    ) -> bool:
        counts, limit = state.window_counts(), state.limit
        counts.seen, counts.heard = max(counts.seen, counts.heard), 0  # no longer in flight
        if answer is None:
            scaled = push.hits * state.nodes.value
            counts.seen += int(scaled)
            if scaled > limit.requests_per_unit / limit.spans:
                state.block(_block_end(state, now_ms, state.window))
                return True
            return False
        if push.window != state.window:  # a late push: its total no longer gates requests
            return False
        total = answer.total
        counts.seen, counts.seen_ms = max(counts.seen, total), now_ms
        counts.resumed = 0  # the store's total holds what the key counted before its eviction
        early = self.early
        if early and not state.nodes.ratio and _early_share(state, total, early.live_nodes):
            self._push_early(state, now_ms)
        if state.edge and early and at_edge(state, counts, now_ms, early.live_nodes):
            enter_edge(counts, limit)
        return self.rearm(state, now_ms)

    def rearm(self, state: KeyState, now_ms: int) -> bool:
        """A window known over MAX blocks a cooldown past each answer or silent span end."""
        over = state.window_counts().seen > state.limit.requests_per_unit
        return over and state.block(_block_end(state, now_ms, state.window), now_ms)

    def after_sync(self, state: KeyState, sync_ms: int, answered: bool) -> None:
        """The next span's ceiling, from the window's pace, once every answer is in. A window's
        first sync (no pace yet) keeps the previous window's; no answer: back to MAX."""
        limit, counts = state.limit, state.window_counts()
        if not answered:
            counts.ceiling = float(limit.requests_per_unit)
            state.nodes.caution(False)
            return
        if state.edge:  # its own ceiling at the edge, MAX before (core/edge.py)
            counts.ceiling = edge_ceiling(limit) if counts.edge else float(limit.requests_per_unit)
            return
        if not self.lenient:  # the ceiling stays MAX
            return
        elapsed = sync_ms - state.window * limit.window_ms
        if 2 * elapsed * limit.spans < limit.window_ms:
            return
        rpu = limit.requests_per_unit
        share = rpu / limit.spans
        slack = min(share, max(0.0, rpu + share - counts.seen * limit.window_ms / elapsed))
        if slack > 0:
            slack += max(0.0, _noise(state, elapsed) - share)
        counts.ceiling = rpu + slack
        state.nodes.caution(counts.ceiling > rpu)


def _estimate(state: KeyState, counts: WindowCounts) -> float:
    """`core.edge.estimate`, in this module: a call within a compiled module costs less than
    one across modules, and this one runs on every hit of a key under the default
    (docs/PERFORMANCE.md; tests/unit/core/test_edge.py checks that the two agree)."""
    unpushed = state.inflight + state.pending
    return counts.seen + counts.resumed + unpushed * state.nodes.value


def _early_share(state: KeyState, total: int, live_nodes: int) -> bool:
    """Until a window teaches `nodes`: a key that started alone takes each answer's share (total
    over pushed, at most the live nodes) and re-arms its early push, at each hit once under two
    a node are left; one that started shared only rises. True: alone, it holds past the mark."""
    nodes, counts, rpu = state.nodes, state.window_counts(), state.limit.requests_per_unit
    pushed = nodes.admitted - state.pending
    share = max(1.0, min(total / pushed, live_nodes)) if pushed > 0 else 0.0
    if not counts.alone or not share:
        if share > nodes.value:
            nodes.set(share)
        return False
    nodes.guess(share)
    left = (rpu - total) / live_nodes
    if live_nodes > 1 and left > 0:
        counts.early_at = left if left >= 2 else 0
    return share == 1 and state.pending > counts.early_at


def _over(state: KeyState, counts: WindowCounts, unpushed: int, now_ms: int) -> bool:
    """The estimate passes the ceiling, or the known count MAX, with `unpushed` own hits. At the
    edge, the others' hits since the store's total are the fleet's pace over its age."""
    if counts.edge:
        estimate = counts.seen + counts.resumed + unpushed + others_since(state, counts, now_ms)
    else:
        estimate = counts.seen + counts.resumed + unpushed * state.nodes.check
    return estimate > counts.ceiling or counts.seen + unpushed > state.limit.requests_per_unit


def retry_wait_ms(state: KeyState, hits: int, now_ms: int) -> int:
    """Until a retry of `hits` is admitted if the counts are as estimated: not before the block
    ends, nor, while the window has no room for them, before it ends; then not before the block
    its remaining syncs likely set (the fleet is at MAX, other nodes still admit on their
    estimates, and a total over MAX re-arms the cooldown at every span end). Not the span's end:
    obedient clients retried into a block."""
    # Cheapest tests first: under a retry storm every refusal comes here.
    end = window_end(now_ms, state.limit.window_ms)
    at = max(state.blocked_until, now_ms)
    unpushed = state.inflight + state.pending + hits
    if at < end and hits > 0 and _over(state, state.window_counts(), unpushed, now_ms):
        at = end
    rearmed = _rearmed_block_end(state, now_ms, end)
    if rearmed > at and _likely_over(state):
        at = rearmed
    return at - now_ms


def _likely_over(state: KeyState) -> bool:
    """The window will likely end over MAX: it already is (for sure), or other nodes share the
    key (`nodes` > 1: only they can admit past MAX) and the known count is within a span's share
    of MAX (`retry_storm` shows how often such a refusal meets a block at the window's end). At
    the edge the fleet is held to MAX: only a count known over it says so."""
    rpu, spans = state.limit.requests_per_unit, state.limit.spans
    known = state.window_counts().seen + state.inflight + state.pending
    if known > rpu:
        return True
    return not state.edge and state.nodes.value > 1 and known * spans >= rpu * (spans - 1)


def _rearmed_block_end(state: KeyState, now_ms: int, end: int) -> int:
    """Each sync re-arms the cooldown, the last where the window's last span starts; in that span,
    a window not over yet gets its block from the final push, at the window's end."""
    limit = state.limit
    if limit.cooldown_window_end:
        return end
    last_span_ms = (
        limit.window_ms - ((limit.spans - 1) * limit.window_ms + limit.spans - 1) // limit.spans
    )
    start = end - last_span_ms
    if now_ms >= start:
        if state.window_counts().seen + state.inflight + state.pending > limit.requests_per_unit:
            return 0  # over already: its block is set, the final push re-arms nothing
        start = end
    penalty = state.penalty
    if penalty is None:
        return start + limit.cooldown
    return start + penalty.length_at(limit.cooldown, start)


def _block_end(state: KeyState, start_ms: int, window: int) -> int:
    """After the cooldown, or with `cooldown: window_end` at `window`'s end (as the reference)."""
    if state.limit.cooldown_window_end:
        return (window + 1) * state.limit.window_ms
    return state.cooldown_end(start_ms)


def _noise(state: KeyState, elapsed_ms: int) -> float:
    limit = state.limit
    own = max(0, state.nodes.admitted - state.pending)  # pushed so far in this window
    per_span = own * limit.window_ms / (limit.spans * elapsed_ms)
    return NOISE_SIGMAS * state.nodes.value * math.sqrt(per_span)
