"""Which fixed-window keys the shared store must hear from at a span end, and how much.

Most keys of a per-user or per-IP limit stay far below it: syncing each of them every span
would make the store work harder than a call per request. The store's work follows the keys
whose count can matter instead. At a span end a fixed-window key is:

- near: the fleet's count as this node estimates it (the store's last total plus own hits not
  yet counted there, each standing for `nodes`) has reached NEAR_SHARE of MAX, or the store
  announced that another node's push did (a near notice), or the key is blocked. It is pushed
  every span, even with nothing to add, since the answer carries the total and the block flag,
  and its finished window's total is read for the nodes estimate.
- quiet: not near, nothing pushed in this window yet, and own hits times the fleet's live node
  count below `quiet_share` of MAX. Its hits stay here: no push, no flag, no read. If every
  live node holds as much, the fleet holds less than quiet_share x MAX that no estimate sees:
  that is the most holding hits back can over-admit in a window. Hits still held when the
  window ends are never sent: nobody reads the total of a window that never came near its
  limit. A shutdown pushes them (nothing admitted is lost while its window runs).
- pushed: any other key with hits in the span pushes them; an empty span sends nothing.

A node that does not know the live node count (no heartbeat answered yet) holds nothing back.
Sliding windows and token buckets push every span: their spans and debts need every answer.
"""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.core.types import KeyId

QUIET_SHARE = 0.1  # the default quiet bound, as a share of MAX for the whole fleet
NEAR_SHARE = 0.5  # a key whose fleet count reaches this share of MAX is synced every span
HEARD_KEYS = 10_000  # near notices kept for keys this node does not track yet

HOLD, SYNC = 0, 1  # what a span end does for a key: nothing, or push (even an empty span)
NEVER = float("inf")  # an early push threshold no count reaches


def near_at(max_hits: int) -> float:
    """The count from which a key is near its limit (sync.lua announces the crossing)."""
    return NEAR_SHARE * max_hits


class EarlySync:
    """A new key's first push, asked for before its span ends: a key that assumed it had its
    gateway alone (core/fleet.py) and whose own hits pass an even share of MAX. The request
    check asks (`want`); the sync loop, woken by `wake`, syncs at `due_ms` instead of the span
    end. Until the answer comes the key keeps admitting as if alone: when every node sees a new
    key's burst at once, the fleet over-admits what the nodes admit in that round trip."""

    __slots__ = ("due_ms", "live_nodes", "wake")

    def __init__(self) -> None:
        self.due_ms: int | None = None
        self.wake: Callable[[], None] | None = None  # the sync loop's, if it sleeps
        self.live_nodes = 1  # the fleet's, from the heartbeats: what a shared key falls back to

    def want(self, now_ms: int) -> None:
        if self.due_ms is None or now_ms < self.due_ms:
            self.due_ms = now_ms
        if self.wake is not None:
            self.wake()


class HeardTotals:
    """Near notices for keys this node does not track: the fleet's total of the key's window,
    taken by the key's counter when its first request makes one, so that a client moving to
    this gateway does not start over from zero. Keyed by the store's digest of the key (the
    notice names nothing else); the oldest notices go first past HEARD_KEYS."""

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
