"""Which fixed-window keys the shared store hears from, and a new key's first window.

Most keys of a per-user or per-IP limit stay far below it: syncing each of them every span
would make the store work harder than a call per request. The store's work follows the keys
whose count can matter instead. At a span end a fixed-window key is either:

- quiet: nothing pushed in this window yet, not near its limit (below), and its own hits times
  the fleet's live node count under `quiet_share` of MAX. Its hits stay here: no push, no
  flag, no expiry, no read. If every live node holds as much, the fleet holds less than
  quiet_share x MAX that no estimate sees: that is the most holding hits back can over-admit in
  a window. Hits still held when the window ends are never sent (nobody reads the total of a
  window that never mattered); a shutdown pushes them. A node that does not know the live
  node count (no heartbeat answered yet) holds nothing back.
- or synced as every key was before: pushed every span, even with nothing to add (the answer
  carries the total and the block flag), its finished window's total read for the nodes
  estimate.

Near its limit means: the store announced that a push took the window to NEAR_SHARE of MAX
(sync.lua's near notice), or the previous window ended there; such a key is synced from the
window's start. A node keeps the totals announced for keys it does not track yet, for their
first request (`HeardTotals`): a client moving to this gateway does not start over from zero.

A new key of a request assumes its client uses this gateway alone (most clients use one):
it may take its whole limit here. Once its own unpushed hits pass an even share of what is
left (MAX less the store's total, over the live nodes), its push leaves at once (`EarlySync`)
instead of at the span end, and each answer re-arms that at an even share of what is then
left; the answer's total over what the node pushed raises its nodes estimate, at most to the
live node count (core/fixed_window.py). When every node sees a new key's burst at once, the
fleet over-admits what the nodes admit during those round trips. Without a store answering, and
for hits a gateway reports as already admitted (RLQS), a new key assumes an even split.

Sliding windows and token buckets are synced every span: their spans and debts need every
answer.
"""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.keystate import NEVER, NO_WINDOW, KeyState, WindowCounts
from ratelimit_sidecar.core.types import KeyId

QUIET_SHARE = 0.1  # the default quiet bound, as a share of MAX for the whole fleet
NEAR_SHARE = 0.5  # sync.lua announces a window's count reaching this share of MAX
HEARD_KEYS = 10_000  # near notices kept for keys this node does not track yet


class EarlySync:
    """What the fixed window's request check needs of the fleet for a new key: the live node
    count, and where to ask for an early push (`want`); the sync loop, woken by `wake`, syncs at
    `due_ms` instead of the next span end."""

    __slots__ = ("due_ms", "live_nodes", "wake")

    def __init__(self) -> None:
        self.due_ms: int | None = None
        self.wake: Callable[[], None] | None = None  # the sync loop's, if it sleeps
        self.live_nodes = 1  # from the heartbeats

    def want(self, now_ms: int) -> None:
        if self.due_ms is None or now_ms < self.due_ms:
            self.due_ms = now_ms
        if self.wake is not None:
            self.wake()


class HeardTotals:
    """Near notices for keys this node does not track, keyed by the store's digest of the key
    (the notice names nothing else); the oldest go first past HEARD_KEYS."""

    __slots__ = ("_digest", "_totals")

    def __init__(self, digest: Callable[[KeyId], str] | None) -> None:
        self._digest = digest
        self._totals: dict[str, tuple[int, int]] = {}  # digest -> (window, total)

    def put(self, digest: str, window: int, total: int) -> None:
        if self._digest is None:
            return
        self._totals.pop(digest, None)
        if len(self._totals) >= HEARD_KEYS:
            del self._totals[next(iter(self._totals))]
        self._totals[digest] = (window, total)

    def take(self, key: KeyId, window: int) -> int:
        """The total heard for `key`'s `window` (forgotten once taken), 0 if none."""
        if not self._totals or self._digest is None:
            return 0
        heard = self._totals.pop(self._digest(key), None)
        return heard[1] if heard is not None and heard[0] == window else 0

    def __len__(self) -> int:
        return len(self._totals)


class QuietKeys:
    """The rule above, for one node's fixed-window keys."""

    __slots__ = ("fleet", "heard", "hits", "nodes_known", "share")

    def __init__(self, share: float, fleet: EarlySync, heard: HeardTotals) -> None:
        self.share = share  # 0: every key is synced
        self.fleet = fleet
        self.heard = heard
        self.nodes_known = False  # a heartbeat has told the live node count
        self.hits = 0  # held hits whose window ended unpushed (cumulative)

    def quiet(self, state: KeyState, counts: WindowCounts, now_ms: int) -> bool:
        """Held back at this span end: not near, nothing pushed in the window, not blocked,
        under the quiet bound."""
        if counts.near or counts.pushed or not self.nodes_known or now_ms < state.blocked_until:
            return False
        return state.pending * self.fleet.live_nodes < self.share * state.limit.requests_per_unit

    def forget_held(self, state: KeyState, now_ms: int) -> None:
        """A quiet key's window ends or it leaves the table: its held hits end here."""
        counts = state.counts
        if isinstance(counts, WindowCounts) and self.quiet(state, counts, now_ms):
            self.hits += state.pending
            state.pending = 0

    def roll(self, state: KeyState, now_ms: int) -> int:
        """The key's window roll (`KeyState.roll`: returns the hits it had to drop). A quiet
        window's held hits end with it; a window this node never synced has no total worth
        reading; one that ended near its limit makes the next one near from its start."""
        counts, window = state.counts, now_ms // state.limit.window_ms
        if not isinstance(counts, WindowCounts) or window == state.window:
            return state.roll(now_ms)
        self.forget_held(state, now_ms)
        synced = counts.near or counts.pushed
        near = counts.seen >= NEAR_SHARE * state.limit.requests_per_unit
        consecutive = window == state.window + 1
        dropped = state.roll(now_ms)
        counts.near = near and consecutive
        if not synced:
            state.nodes.window = NO_WINDOW
        return dropped

    def start_key(self, state: KeyState) -> None:
        """A key new to this node: the total the store announced for its window counts; one
        that assumes it is alone pushes early past an even share."""
        counts = state.counts
        if not isinstance(counts, WindowCounts):
            return
        if total := self.heard.take(state.key, state.window):
            counts.seen, counts.near = max(counts.seen, total), True
        elif state.nodes.value == 1 and self.fleet.live_nodes > 1:
            counts.alone = True
            counts.early_at = state.limit.requests_per_unit / self.fleet.live_nodes

    def announced(self, state: KeyState, window: int, total: int) -> None:
        """A near notice for a tracked key: it takes the total and is synced every span."""
        counts = state.counts
        if isinstance(counts, WindowCounts) and state.window == window:
            counts.seen, counts.near = max(counts.seen, total), True

    @staticmethod
    def pushed(state: KeyState) -> None:
        counts = state.counts
        if isinstance(counts, WindowCounts):
            counts.pushed, counts.early_at = True, NEVER


def new_key_nodes(limit: RateLimit, alone: bool, store_up: bool, live_nodes: int) -> float:
    """A new key's nodes estimate: 1 for a fixed-window key of a request while the store
    answers (it assumes its gateway alone), else an even split over the live nodes (an int
    as it is: one object every new key shares)."""
    if alone and store_up and limit.algorithm is AlgorithmName.FIXED_WINDOW:
        return 1
    return live_nodes
