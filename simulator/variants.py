"""The systems a scenario compares: the core as shipped, variants of it, and two baselines.

A variant of the decision rule is the shipped fixed window with a part of it turned off (its
switches: core/fixed_window.py); a variant of the fleet (the span clock, an oracle for `nodes`)
is a setting of the engine. Nothing here re-implements the core.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from ratelimit_sidecar.core import FixedWindow

DEFAULT_RULE = FixedWindow()  # the shipped rule


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
    algorithm: FixedWindow = DEFAULT_RULE
    shared: bool = True  # False: each node alone, a MAX/nodes rule (local-only mode)
    store_clock: bool = False  # True: nodes read spans off the store's clock (Redis TIME)
    raw_store_clock: bool = False  # True: ... without compensating half the round trip
    central: bool = False  # True: the exact central counter, no limiter at all
    oracle_nodes: bool = False  # True: nodes set to the true inverse share (diagnostic)
    rlqs: float = 0.0  # share of the gateways on RLQS (simulate/rlqs.py); 0: all on RLS
    new_keys_alone: bool = True  # False: a new key assumes an even split (the rule before)
    edge: bool = False  # True: the rule says `consistency: edge` (core/edge.py)
    # True: the rule says `consistency: strict`: RLQS gateways get leases (core/quota_lease.py);
    # ShouldRateLimit gateways are decided from memory, as the simulator has no strict store call
    strict: bool = False


_HARD = FixedWindow(lenient=False, estimate_blocks=True)
SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("core", "the shipped core: seen + (inflight + pending) x nodes, lenient ceiling"),
        System(
            "strict",
            "decision (i) undone: the estimate over MAX always rejects",
            FixedWindow(lenient=False),
        ),
        System("hard", "variant (d) undone: an estimate over MAX starts a cooldown", _HARD),
        System(
            "admitted",
            "bug 2 undone: nodes from admitted counts only",
            FixedWindow(nodes_from_offered=False),
        ),
        System(
            "old",
            "the core before (d) and bug 2: hard + admitted",
            replace(_HARD, nodes_from_offered=False),
        ),
        System("local", "baseline: local-only limits, MAX/nodes per node, no sync", shared=False),
        System(
            "exact", "baseline: exact central counter, a global check per request", central=True
        ),
        System(
            "redis-time", "variant (b): spans on the store clock (Redis TIME)", store_clock=True
        ),
        System(
            "redis-time-raw",
            "variant (b'): Redis TIME, half the round trip not compensated",
            store_clock=True,
            raw_store_clock=True,
        ),
        System("oracle", "diagnostic: nodes = true global/local share", oracle_nodes=True),
        System(
            "edge",
            "consistency: edge: keys near their limit pushed fast (spans on Redis TIME)",
            store_clock=True,
            edge=True,
        ),
        System(
            "even-split",
            "a new key assumes an even split over the live nodes (before quiet keys)",
            new_keys_alone=False,
        ),
        System("rlqs", "every gateway on RLQS: Envoy token buckets, 5 s usage reports", rlqs=1.0),
        System(
            "rlqs-edge",
            "every gateway on RLQS, the limit's consistency: edge (kept over a minute's window)",
            store_clock=True,
            rlqs=1.0,
            edge=True,
        ),
        System("rlqs-half", "every other gateway on RLQS, the rest on ShouldRateLimit", rlqs=0.5),
        System(
            "rlqs-lease",
            "every gateway on RLQS, the limit's consistency: strict (a fixed window leased)",
            store_clock=True,
            rlqs=1.0,
            strict=True,
        ),
    )
}
BASELINES = ("core", "local", "exact")
VARIANTS = ("core", "strict", "old", "hard", "admitted", "redis-time", "oracle")


def system_for(name: str) -> System:
    """A named system, or variants combined with `+` (e.g. `admitted+redis-time`)."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system {unknown[0]!r}; known: {', '.join(SYSTEMS)}")
    specs = [SYSTEMS[p] for p in parts]
    if len(specs) == 1:
        return specs[0]
    if any(s.central or not s.shared for s in specs):
        raise ValueError("baselines (local, exact) cannot be combined")
    return replace(
        specs[0],
        name=name,
        about=" + ".join(s.about for s in specs),
        algorithm=_combined(s.algorithm for s in specs),
        store_clock=any(s.store_clock for s in specs),
        raw_store_clock=any(s.raw_store_clock for s in specs),
        oracle_nodes=any(s.oracle_nodes for s in specs),
        rlqs=max(s.rlqs for s in specs),
        edge=any(s.edge for s in specs),
        strict=any(s.strict for s in specs),
    )


def _combined(rules: Iterable[FixedWindow]) -> FixedWindow:
    """Every parameter that any of `rules` changes from the shipped default."""
    changed: dict[str, Any] = {}
    for rule in rules:
        for f in fields(FixedWindow):
            if f.name == "early":  # the fleet limiter's own, set when it is built
                continue
            value = getattr(rule, f.name)
            if value != getattr(DEFAULT_RULE, f.name):
                changed[f.name] = value
    return replace(DEFAULT_RULE, **changed)
