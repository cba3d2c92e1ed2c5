"""Which fixed-window keys the shared store hears from, and a new key's first window.

Most keys of a per-user or per-IP limit stay far below it: syncing each every span would cost
the store more than a call per request. At a span end a fixed-window key is either:

- quiet: nothing pushed in this window yet, not near its limit, own hits times the live node
  count under `quiet_share` of MAX. Its hits stay here (no push, flag, expiry or read): the
  fleet holds under quiet_share x MAX unseen, the most this can over-admit in a window. Held
  hits are dropped at the window's end (no total that never mattered is read), pushed at a
  shutdown. Without a live node count (no heartbeat answered yet) nothing is held.
- or synced: pushed every span (the answer carries the total and the flag), unless blocked
  without a penalty (`blocked_alone`); its finished window's total read for the nodes estimate.

Near its limit: the store announced a push took the window to NEAR_SHARE of MAX (sync.lua), or
the previous window ended there: synced from the window's start. Notices for untracked keys are
kept (`HeardTotals`): a client moving here does not start from zero.

A new key of a request assumes its client uses this gateway alone (most do): it may take its
whole limit here. Past an even share of what is left (MAX less the store's total, over the live
nodes) its push leaves at once (`EarlySync`), re-armed by each answer; while its answers show it
alone, the store announces each of its pushes past NEAR_SHARE, so a gateway its client moves to
starts from all it admitted. A burst every node sees at once over-admits what they admit during
those round trips. Without a store answering, and for RLQS-reported hits, a new key assumes an
even split.

Sliding windows and token buckets need every answer once synced. At the edge one that never
pushed is quiet while this node holds HELD_TRAILING hit of it at most, within the quiet bound:
a flood of keys seen once costs the store nothing. The hit stays across span and window ends
(pushed with the next, in its span: it leaves the store's count later, never sooner) and is
forgotten once it counts no more: out of the trailing window, or the bucket full again. One
hit, not `new_key_push_at`: a new key's early share is learnt span by span, and the others'
held hits are missing from those spans (core/sliding_window.py adds one per other node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ratelimit_sidecar.core.edge import LATE_PUSH_MS, enter, first_read_due, new_key_push_at
from ratelimit_sidecar.core.keystate import NEVER, NO_WINDOW, Bucket, KeyState, WindowCounts
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.spans import span_number
from ratelimit_sidecar.core.types import KeyId

QUIET_SHARE = 0.1  # the default quiet bound, as a share of MAX for the whole fleet
NEAR_SHARE = 0.5  # sync.lua announces a window's count reaching this share of MAX
HEARD_KEYS = 10_000  # near notices kept for keys this node does not track yet
HELD_TRAILING = 1  # hits of a trailing key at the edge a node holds back at most

# A leased trailing window (core/spancounts.py, `LeasedSpans`) reads its spans again this soon
# after another node's lease push is announced: once for the pushes of that time. Read at each
# (20 ms later), 8 gateways' counter cost Redis 3.7 calls per request at 0.8 x MAX and 2.4 at
# twice MAX (seed 1); 2.2 and 1.0 this way, the bound held (220-243 of 240); 1 s: 258 at 10 x.
LEASE_READ_MS = 250


class EarlySync:
    """The live node count, and an early push (`want`): the sync loop, woken, syncs at `due_ms`."""

    __slots__ = ("due_ms", "live_nodes", "states", "store_up", "wake")

    def __init__(self) -> None:
        self.due_ms: int | None = None
        self.wake: Callable[[], None] | None = None  # the sync loop's, if it sleeps
        self.live_nodes = 1  # from the heartbeats
        self.store_up = True  # the last sync was answered: pushing early is worth it
        # The keys that asked, for a sync between span ends (only they are planned then).
        self.states: list[KeyState] = []

    def want(self, due_ms: int, state: KeyState, *, wake: bool = True) -> None:
        """`state` asks for a push at `due_ms`; the sync loop is woken to plan its sleep (not
        from the sync itself: it plans after)."""
        state.next_sync = min(state.next_sync, due_ms)
        self.states.append(state)
        if self.due_ms is None or due_ms < self.due_ms:
            self.due_ms = due_ms
            if wake and self.wake is not None:
                self.wake()

    def read_again(self, state: KeyState, counts: SpanState | Bucket, now_ms: int) -> None:
        """A sliding window or bucket near MAX after a span end's first answer reads again
        LATE_PUSH_MS later, once a span (core/edge.py)."""
        counts.reread_span = span_number(now_ms, state.limit)
        self.want(now_ms + LATE_PUSH_MS, state)

    def first_read(self, state: KeyState, now_ms: int) -> None:
        """A sliding window or bucket at the edge that never pushed: its first read, past a few
        own hits (core/edge.py)."""
        if self.store_up and first_read_due(state, now_ms):
            self.want(now_ms, state)


def read_again_asked(state: KeyState, counts: SpanState | Bucket, now_ms: int) -> bool:
    """This span's first answer asked a sliding window or bucket to read again."""
    return counts.reread_span == span_number(now_ms, state.limit)


class Heard(NamedTuple):
    """A near notice of a key this node does not track yet."""

    window: int
    total: int
    edge_ms: int = -1  # a push at the edge (core/edge.py), heard then; -1: a near notice


class HeardTotals:
    """Near notices for untracked keys, by the store's digest (the notice names nothing else)."""

    __slots__ = ("_digest", "_totals")

    def __init__(self, digest: Callable[[KeyId], str] | None) -> None:
        self._digest = digest
        self._totals: dict[str, Heard] = {}

    def put(self, digest: str, window: int, total: int, edge_ms: int = -1) -> None:
        self._totals.pop(digest, None)
        if len(self._totals) >= HEARD_KEYS:
            del self._totals[next(iter(self._totals))]
        self._totals[digest] = Heard(window, total, edge_ms)

    def take(self, key: KeyId, window: int) -> Heard | None:
        if not self._totals or self._digest is None:
            return None
        heard = self._totals.pop(self._digest(key), None)
        return heard if heard is not None and heard.window == window else None


class QuietKeys:
    __slots__ = ("fleet", "heard", "hits", "nodes_known", "share")

    def __init__(self, share: float, fleet: EarlySync, heard: HeardTotals) -> None:
        self.share = share  # 0: every key is synced
        self.fleet = fleet
        self.heard = heard
        self.nodes_known = False  # a heartbeat has told the live node count
        self.hits = 0  # held hits never pushed: their window ended, or they count no more

    def quiet(self, state: KeyState, now_ms: int) -> bool:
        """Held back at this span end; not blocked either."""
        counts = state.counts
        if isinstance(counts, WindowCounts):
            synced = counts.near or counts.pushed or counts.edge
        else:
            synced = not self.holds(state) or state.pending > HELD_TRAILING
        if synced or not self.nodes_known or now_ms < state.blocked_until:
            return False
        if state.edge and state.pending > new_key_push_at(state.limit):
            return False  # it asked for its window's total (core/edge.py)
        return state.pending * self.fleet.live_nodes < self.share * state.limit.requests_per_unit

    @staticmethod
    def holds(state: KeyState) -> bool:
        """A sliding window or bucket at the edge that never pushed: its hits may stay here."""
        counts = state.counts
        return state.edge and isinstance(counts, SpanState | Bucket) and not counts.pushed

    def expire(self, state: KeyState, now_ms: int) -> None:
        """A trailing key's held hits that count no more are forgotten: out of the trailing
        window (the span leaving it too), or the bucket full again."""
        if state.pending <= 0 or not self.holds(state):
            return
        counts, limit = state.counts, state.limit
        if isinstance(counts, Bucket):
            left = state.pending if now_ms * limit.requests_per_unit < counts.tat else 0
        else:
            own = counts.own if isinstance(counts, SpanState) else None
            first = span_number(now_ms, limit) - limit.spans
            left = min(state.pending, own.since(first)) if own is not None else 0
        self.hits += state.pending - left
        state.pending = left

    @staticmethod
    def blocked_alone(state: KeyState, now_ms: int) -> bool:
        """Refusing, and no offences to report (a penalty's): nothing to tell the store."""
        return now_ms < state.blocked_until and state.penalty is None

    def forget_held(self, state: KeyState, now_ms: int) -> None:
        if self.quiet(state, now_ms):
            self.hits += state.pending
            state.pending = 0

    def roll(self, state: KeyState, now_ms: int) -> int:
        """A window never synced has no total worth reading; a near one's next starts near."""
        counts, window = state.counts, now_ms // state.limit.window_ms
        if window == state.window:
            return 0
        if not isinstance(counts, WindowCounts):
            return self._roll_trailing(state, now_ms)
        self.forget_held(state, now_ms)
        synced = counts.near or counts.pushed
        # A block in it says it was over, even where a blocked node stopped reading the total.
        hot = state.blocked_until > state.window * state.limit.window_ms
        near = hot or counts.seen >= NEAR_SHARE * state.limit.requests_per_unit
        near = near and window == state.window + 1
        dropped = state.roll(now_ms)
        counts.near = near
        if not synced:
            state.nodes.window = NO_WINDOW
        return dropped

    def _roll_trailing(self, state: KeyState, now_ms: int) -> int:
        """A never pushed trailing key's hits outlive its window: they still count (`expire`
        says when not), pushed with the next push. The window's total holds none of them:
        nothing to learn `nodes` from, no read."""
        if not self.holds(state):
            return state.roll(now_ms)
        held, state.pending = state.pending, 0
        state.roll(now_ms)
        state.pending, state.nodes.window = held, NO_WINDOW
        return 0

    def start_key(self, state: KeyState) -> None:
        counts = state.counts
        if not isinstance(counts, WindowCounts):
            return
        if heard := self.heard.take(state.key, state.window):
            counts.seen, counts.near = max(counts.seen, heard.total), True
            if heard.edge_ms >= 0 and state.edge:  # the fleet is at the edge: so is this node
                enter(counts, state.limit)
                counts.seen_ms = heard.edge_ms
        elif state.nodes.value == 1 and self.fleet.live_nodes > 1:
            counts.alone = True
            counts.early_at = state.limit.requests_per_unit / self.fleet.live_nodes
        if state.edge:  # its window may be at the edge already: its total, soon
            counts.early_at = min(counts.early_at, new_key_push_at(state.limit))

    def announced(self, state: KeyState, window: int, total: int, now_ms: int) -> None:
        counts = state.counts
        if isinstance(counts, WindowCounts) and state.window == window and not counts.near:
            # A push in flight may be in the total or not: the total waits for its answer.
            counts.heard, counts.near = max(counts.heard, total), True
            counts.seen = counts.seen if state.inflight else max(counts.seen, total)
            if counts.alone and state.pending:  # the others need it now (docs/QUIET_KEYS.md)
                self.fleet.want(now_ms, state)

    def edge_announced(self, state: KeyState, window: int, total: int, now_ms: int) -> None:
        """Another node's push at the edge (core/edge.py): the key is at the edge here too, and
        its unpushed hits go at once."""
        counts = state.counts
        if isinstance(counts, SpanState) and counts.leased is not None and self.fleet.store_up:
            self.fleet.want(now_ms + LEASE_READ_MS, state)  # another node's lease: read again
            return
        if not isinstance(counts, WindowCounts) or state.window != window or not state.edge:
            return
        counts.heard, counts.near = max(counts.heard, total), True
        enter(counts, state.limit)
        if not state.inflight:
            counts.seen, counts.seen_ms = max(counts.seen, total), now_ms
        if state.pending and self.fleet.store_up:
            self.fleet.want(now_ms, state)

    @staticmethod
    def pushed(state: KeyState, now_ms: int) -> None:
        counts = state.counts
        if isinstance(counts, WindowCounts):
            counts.pushed, counts.early_at, counts.pushed_ms = True, NEVER, now_ms
        elif isinstance(counts, SpanState | Bucket):
            counts.pushed = True  # its first read at the edge is done (core/edge.py)
