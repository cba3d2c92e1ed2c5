"""The systems a scenario compares: the core as shipped, variants of it, and two baselines.

Variants live here only, as subclasses of the core's `Limiter` that override one hook, so
the shipped core is never edited to try an idea. `SeenCheck` re-implements the core's own
request-path check through the same hook; a test proves it matches the core decision for
decision, which is what makes the other overrides trustworthy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ratelimit_sidecar.core import Code, Hit, Limiter, SyncBatch, SyncResult, SyncStats, Verdict
from ratelimit_sidecar.core.keystate import KeyState

EWMA_ALPHA = 0.5


class CheckVariant(Limiter):
    """The core with a different request-path check.

    Every decision goes through `_judge` (the core's fast path `admit` is switched off, so
    it cannot admit what the variant would reject). With `cooldown` False (the core's way) a
    rejection is handed to the core's `_estimate_over`: it starts a cooldown only if the known
    count is over, else it rejects the request alone. With `cooldown` True any estimate over
    its ceiling blocks for the cooldown (the core before decision (d))."""

    cooldown = False

    def estimate(self, state: KeyState, hits: int) -> float:
        raise NotImplementedError

    def ceiling(self, state: KeyState) -> float:
        return state.limit.requests_per_unit

    def admit(self, now_ms: int, hit: Hit) -> Verdict | None:  # noqa: ARG002
        return None

    def _judge(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        # Same steps as `Limiter._judge`; only the check differs.
        self.dropped_hits += state.roll(now_ms)
        limit = state.limit
        if now_ms < state.blocked_until:
            return self._over(state, now_ms)
        if hits > 0 and self.estimate(state, hits) > self.ceiling(state):
            if not self.cooldown:
                return self._estimate_over(state, hits, now_ms)
            state.block(now_ms + limit.cooldown)
            return self._over(state, now_ms)
        return Verdict(Code.OK, limit)


class SeenCheck(CheckVariant):
    """The core's check, re-implemented: seen + (inflight + pending + hits) x check_nodes
    over the span's ceiling, or the known count over MAX (always a cooldown then)."""

    def estimate(self, state: KeyState, hits: int) -> float:
        known = state.seen + state.inflight + state.pending + hits
        if known > state.limit.requests_per_unit:
            return float("inf")
        return state.seen + (state.inflight + state.pending + hits) * state.check_nodes

    def ceiling(self, state: KeyState) -> float:
        return state.ceiling


class StrictCheck(CheckVariant):
    """The core before the lenient ceiling: seen + (inflight + pending + hits) x nodes over
    MAX rejects, whatever the window's pace (decision (i) undone)."""

    def estimate(self, state: KeyState, hits: int) -> float:
        return state.used() + hits * state.nodes


class HardSeenCheck(StrictCheck):
    """The strict estimate, and any estimate over MAX starts a full cooldown (as shipped
    before decision (d))."""

    cooldown = True


class AdmittedNodes(Limiter):
    """`nodes` learnt from admitted counts only, as shipped before the fix of bug 2: the hits
    a node rejected on its estimate are left out of the ratio."""

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        for read in batch.total_reads:
            state = self.keys.get(read.key)
            if state is not None:
                state.estimate_rejected = 0
        return super().apply_sync(now_ms, batch, result, resend)


class HardAdmitted(HardSeenCheck, AdmittedNodes):
    """The core as shipped before decision (d) and the fix of bug 2."""


class PendingCheck(CheckVariant):
    """SPEC section 2 step 2 as written (the seed's new step, read per span):
    (pending + hits) x nodes, without `seen`, and a cooldown when over."""

    cooldown = True

    def estimate(self, state: KeyState, hits: int) -> float:
        return (state.pending + hits) * state.nodes


class WindowCheck(CheckVariant):
    """The seed's new step read per window: REQUESTS is this node's count in the window,
    (local + hits) x nodes, and a cooldown when over."""

    cooldown = True

    def estimate(self, state: KeyState, hits: int) -> float:
        return (state.local_cur + hits) * state.nodes


class EwmaNodes(Limiter):
    """Smooths each new `nodes` estimate: nodes = a x measured + (1 - a) x previous.

    The core recomputes `nodes` inside `apply_sync`; wrapping that call and blending with
    the value from before it needs no core hook."""

    alpha = EWMA_ALPHA

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        before = {}
        for read in batch.total_reads:
            state = self.keys.get(read.key)
            if state is not None:
                before[read.key] = (state, state.nodes)
        stats = super().apply_sync(now_ms, batch, result, resend)
        for state, old in before.values():
            if state.nodes != old:
                state.nodes = self.alpha * state.nodes + (1 - self.alpha) * old
                state.refresh_check()
        return stats


class FreezeNodes(Limiter):
    """Keeps `nodes` when the finished window had local rejections: a node that was blocked
    admitted less than its share, so total / local over-states how many nodes there are."""

    def __init__(self) -> None:
        super().__init__()
        self._rejected: set[tuple[tuple[str, ...], int]] = set()

    def _over(self, state: KeyState, now_ms: int) -> Verdict:
        self._rejected.add((state.key, state.window))
        return super()._over(state, now_ms)

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        keep = {}
        for read in batch.total_reads:
            state = self.keys.get(read.key)
            if state is not None and (read.key, read.window) in self._rejected:
                keep[read.key] = (state, state.nodes)
        stats = super().apply_sync(now_ms, batch, result, resend)
        for state, old in keep.values():
            state.nodes = old
            state.refresh_check()
        self._rejected = {(k, w) for k, w in self._rejected if self._recent(k, w)}
        return stats

    def _recent(self, key: tuple[str, ...], window: int) -> bool:
        state = self.keys.get(key)
        return state is not None and window >= state.window - 1


class ExtrapolatedSeen(Limiter):
    """After a push, seen = max(store total, previous seen + pushed x nodes).

    The store total only holds the nodes that pushed before this one at the same boundary;
    the first to push misses up to (nodes-1)/nodes of a span. Extrapolating our own push
    covers the rest, the store total corrects it upwards."""

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        pushed: dict[tuple[str, ...], int] = {}
        before = {}
        for push in batch.pushes:
            state = self.keys.get(push.key)
            if state is not None and push.window == state.window:
                pushed[push.key] = pushed.get(push.key, 0) + push.count
                before[push.key] = (state, state.seen, state.window)
        stats = super().apply_sync(now_ms, batch, result, resend)
        if result is None:
            return stats  # the core's fallback already extrapolates
        for key, (state, seen, window) in before.items():
            if state.window == window:
                state.seen = max(state.seen, seen + int(pushed[key] * state.nodes))
        return stats


class OnceFallback(Limiter):
    """The store-down fallback applied once per hit (emulates a fix of a core bug).

    The core re-runs the fallback on every failed push, and a key's stashed `unsent` is
    re-pushed (and fails again) at every span of an outage: its hits are added to `seen`
    again each span and tested against MAX/N as if they were one span's count. Here only
    this span's own count (what moved to `inflight`) is folded in and tested, once."""

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        if result is not None:
            return super().apply_sync(now_ms, batch, result, resend)
        before = {}
        for push in batch.pushes:
            state = self.keys.get(push.key)
            if state is not None and push.key not in before:
                before[push.key] = (state, state.seen, state.blocked_until, state.inflight)
        stats = super().apply_sync(now_ms, batch, result, resend)
        for state, seen, blocked_until, inflight in before.values():
            limit, scaled = state.limit, inflight * state.nodes
            state.seen, state.blocked_until = seen + int(scaled), blocked_until
            if scaled > limit.requests_per_unit / limit.spans:
                state.block(now_ms + limit.cooldown)
        return stats


@dataclass
class ExactCounter:
    """Baseline: one central counter checked on every request (per-request I/O, the thing
    the product avoids), with the same rule: MAX per true window, then block for C."""

    max: int
    window_ms: int
    cooldown_ms: int
    window: int = -1
    count: int = 0
    blocked_until: int = 0

    def hit(self, t: int) -> bool:
        if t < self.blocked_until:
            return False
        w = t // self.window_ms
        if w != self.window:
            self.window, self.count = w, 0
        if self.count + 1 > self.max:
            self.blocked_until = t + self.cooldown_ms
            return False
        self.count += 1
        return True


@dataclass(frozen=True)
class System:
    """How the engine builds and wires one node's limiter."""

    name: str
    about: str
    limiter: type[Limiter] = Limiter
    shared: bool = True  # False: each node has its own store, a MAX/nodes rule (local-only)
    store_clock: bool = False  # True: nodes read spans off the store's clock (Redis TIME)
    raw_store_clock: bool = False  # True: ... without compensating half the round trip
    central: bool = False  # True: the exact central counter, no limiter at all
    oracle_nodes: bool = False  # True: nodes set to the true inverse share (diagnostic)
    reread: bool = False  # True: GET the current window's total again a quarter span later


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("core", "the shipped core: seen + (inflight + pending) x nodes, lenient ceiling"),
        System("strict", "decision (i) undone: the estimate over MAX always rejects", StrictCheck),
        System("old", "the core before (d) and bug 2: hard + admitted", HardAdmitted),
        System("local", "baseline: local-only limits, MAX/nodes per node, no sync", shared=False),
        System(
            "exact", "baseline: exact central counter, a global check per request", central=True
        ),
        System("seen", "core check re-implemented through the variant hook", SeenCheck),
        System("pending", "variant (a): (pending + hits) x nodes, without seen", PendingCheck),
        System("window", "variant (a'): (local window count + hits) x nodes", WindowCheck),
        System(
            "redis-time", "variant (b): spans on the store clock (Redis TIME)", store_clock=True
        ),
        System(
            "redis-time-raw",
            "variant (b'): Redis TIME, half the round trip not compensated",
            store_clock=True,
            raw_store_clock=True,
        ),
        System("ewma", f"variant (c): nodes smoothed, alpha {EWMA_ALPHA}", EwmaNodes),
        System("hard", "variant (d) undone: an estimate over MAX starts a cooldown", HardSeenCheck),
        System("admitted", "bug 2 undone: nodes from admitted counts only", AdmittedNodes),
        System("freeze", "variant (e): keep nodes after a window with rejections", FreezeNodes),
        System("extrap", "variant (f): seen = max(total, seen + pushed x nodes)", ExtrapolatedSeen),
        System(
            "reread", "variant (g): re-read the window total 1/4 span after a push", reread=True
        ),
        System("once", "variant (h): store-down fallback counted once per hit", OnceFallback),
        System("oracle", "diagnostic: nodes = true global/local share", oracle_nodes=True),
    )
}
BASELINES = ("core", "local", "exact")


def system_for(name: str) -> System:
    """A named system, or variants combined with `+` (e.g. `hard+reread`)."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system {unknown[0]!r}; known: {', '.join(SYSTEMS)}")
    specs = [SYSTEMS[p] for p in parts]
    if len(specs) == 1:
        return specs[0]
    if any(s.central or not s.shared for s in specs):
        raise ValueError("baselines (local, exact) cannot be combined")
    # Most derived first, so every override's super() call reaches the next one and the core.
    bases = tuple(dict.fromkeys(s.limiter for s in specs if s.limiter is not Limiter))
    limiter = type("+".join(c.__name__ for c in bases), bases, {}) if len(bases) > 1 else None
    merged = replace(specs[0], name=name, about=" + ".join(s.about for s in specs))
    return replace(
        merged,
        limiter=limiter or (bases[0] if bases else Limiter),
        store_clock=any(s.store_clock for s in specs),
        raw_store_clock=any(s.raw_store_clock for s in specs),
        oracle_nodes=any(s.oracle_nodes for s in specs),
        reread=any(s.reread for s in specs),
    )


VARIANTS = (
    "core",
    "strict",
    "old",
    "hard",
    "admitted",
    "pending",
    "window",
    "redis-time",
    "ewma",
    "freeze",
    "extrap",
    "reread",
    "once",
    "oracle",
)
