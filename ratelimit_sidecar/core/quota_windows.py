"""Which RLQS counters, and which of their windows, are handed out as leases (pure: it reads
the limiter's counter).

Leases (core/quota_lease.py) hold a fixed window to MAX, where the plain assignments
(core/quota_assign.py) pass it by what the gateways admit between two reports, but they refuse
more under the limit: a lease is sized for a gateway's pace, and a burst runs it dry before the
next report. So a limit at the edge (`consistency: edge`, the default) takes them only where a
window can reach MAX: a window is leased when the one before it reached `lease_from` of MAX as
this node knew its count (the store's total and its own counts, leases included), or when the
bucket saw none before it (a new bucket knows nothing of the key's traffic, and a plain share of
a count of 0 may pass MAX). Otherwise the plain assignments serve it. A `consistency: strict`
limit is leased in every window.

The choice is made at the bucket's first event once its counter is in the new window, so the
window before closes in its own way first (a lease is abandoned at its reset, a plain bucket
refilled). Chosen at the first event by the clock instead, a leased bucket stayed into a plain
window and a plain one was replaced early: 1.1 to 1.8 % refused at 0.8 x MAX, not 0.5 %. A bucket
turning to leases gives up its plain bucket as a lease's at a window's end (`Lease.take_over`).

Measured (simulator, 4 gateways, 50 ms skew, 1 ms store, seeds 1 to 3; refused at 0.8 / 0.95 /
skewed 0.9 x MAX, bursts at 0.8 x; worst window at twice MAX), 240 per 10 s: the plain
assignments 0.52 / 4.4 / 2.1 %, 1.7 %, worst 280 to 335; leased always 1.0 / 2.9 / 3.5 %, 2.7 %,
240 to 243; chosen so, 0.50 / 2.9 / 2.6 %, 1.7 %, 240 to 243. 1,440 a minute: plain 0.00 / 0.06
/ 0.01 %, 0.0 %, 1,516 to 1,665; chosen so, 0.00 / 0.42 / 0.25 %, 0.02 %, 1,437 to 1,547 (a
boundary burst after a window that stayed under 0.95 x MAX). From 0.9 x MAX a minute's windows
at 0.95 x MAX were leased (1.4 % refused); from MAX itself a boundary burst at ten times MAX
passed MAX by 14 %.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratelimit_sidecar.config.model import AlgorithmName, Rule
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.limiter import Limiter
from ratelimit_sidecar.core.quota_assign import QuotaPolicy
from ratelimit_sidecar.core.spans import window_of
from ratelimit_sidecar.core.types import Hit

TRAILING_PACE_WEIGHT = 0.5  # the newest report's part of a trailing window's blended pace


def leasable(rule: Rule | None, policy: QuotaPolicy) -> bool:
    """A counter that may be handed out as leases (core/quota_lease.py): one limit of a minute at
    most, a fixed or sliding window that says `consistency: strict` (always) or `edge` (when
    `LeaseWindows` or `TrailingLeases` below choose; a sliding window's unreported tokens move with
    time, core/spancounts.py `LeasedSpans`): Envoy makes no call per request, so RLQS holds a window
    so. A window longer than a minute outlives a quiet gateway's bucket (Envoy forgets it after a
    minute of empty reports), its lease still counted (simulator, 2,000 a day at 0.8 x MAX on 4
    gateways: 99.5 % refused; 12 % with the lease given back at the abandon, as the count other
    nodes read never drops): it is held at the edge by pushes (`Limiter.count_admitted`). A sliding
    window at the edge is leased by its gateways' pace, and only in a window of two reports at most
    (`QuotaPolicy.paced_within_ms`), where a report's pace is half the window's traffic or more: in
    a minute's window a burst under the limit looked like twice MAX, and its leases refused (4
    gateways, bursts at 0.8 x MAX: 16.5 % refused, plain 10.3 %)."""
    if rule is None or len(rule.limits) != 1 or rule.shadow_mode or policy.shadow_mode:
        return False
    limit = rule.limits[0]
    short = limit.window_ms <= policy.edge_over_ms  # longer: held at the edge, the same split
    fixed = limit.algorithm is AlgorithmName.FIXED_WINDOW and (limit.strict or limit.edge)
    edge_trailing = limit.edge and limit.window_ms <= policy.paced_within_ms
    trailing = limit.algorithm is AlgorithmName.SLIDING_WINDOW and (limit.strict or edge_trailing)
    return short and (fixed or trailing) and limit.requests_per_unit > 0


@dataclass(slots=True)
class LeaseWindows:
    """One bucket's choice for the current fixed window, and what it knew of that window."""

    window: int = -1  # the window `leasing` is for (-1: none seen yet)
    peak: int = 0  # the most this node knew that window to hold
    leasing: bool = False

    def at(self, limiter: Limiter, hit: Hit, now_ms: int, lease_from: float) -> tuple[bool, bool]:
        """Whether the bucket of `hit` (one fixed-window limit) is leased now, and whether that
        was chosen now over a plain window. Its counter as last caught up: a window is chosen
        once the counter is in it."""
        assert hit.rule is not None
        limit, state = hit.rule.limits[0], limiter.keys.get(hit.key)
        if state is not None and state.counts is not None:
            self.saw(state.window, limiter.algorithm_of(state).window_count(state))
        window = window_of(now_ms, limit.window_ms) if state is None else state.window
        was = self.leasing
        return self.choose(window, limit.requests_per_unit, lease_from), not was

    def saw(self, window: int, count: int) -> None:
        """The node's count of `window` (its known total), if it is the current one."""
        if window == self.window:
            self.peak = max(self.peak, count)

    def choose(self, window: int, limit: int, lease_from: float) -> bool:
        """Whether `window` is leased; decided at its first event, then kept. True from a
        window that came near MAX (`lease_from`), or with none seen before."""
        if window != self.window:
            first = self.window < 0
            near = self.peak >= lease_from * limit
            self.window, self.peak, self.leasing = window, 0, first or near
        return self.leasing


@dataclass(slots=True)
class TrailingLeases:
    """One bucket's choice for a trailing window at the edge (a sliding window has no start to
    choose at): leased for a window after the fleet's offered pace came near MAX, plain
    otherwise.

    Near is judged on what is offered (allowed and denied), not on the count: a lease is counted
    before it is spent, so a leased key's count stays near MAX under the limit too, and leases
    refuse more there than the plain assignments (10 s windows, 4 gateways: 21 / 29 / 26 % at
    0.8, 0.95 and skewed 0.9 x MAX, against 14 / 24 / 20 %). One gateway's report counts a few
    seconds of a part of the traffic, so the pace is blended over reports and the bar set well
    over MAX: at 1.1 x MAX blended or 1.5 one report (weight 0.3) the noise of 0.95 x MAX
    reached it and held the windows leased (seed 1: 17.5 / 29.2 / 25.4 % refused, bursts 27.9
    %); at 1.5 and 2.0 (weight 0.5), 17.1 / 26.4 / 24.4 %, 21.0 %, the plain assignments' 16.7 /
    26.0 / 24.4 %, 20.1 %, while twice MAX reaches it within two reports. A new bucket is plain
    until then: leased from its first request, its lease given back at the first quiet report
    left the plain buckets that followed it growing, and boundary bursts at twice MAX passed
    MAX by a third (4 gateways, seeds 1 to 3, before plain buckets kept Envoy's fraction: 324
    of 240 in a trailing window; 282 so, the plain assignments 289), though a new key at ten
    times MAX then holds from its second window only (302; 242 leased first)."""

    pace: float = 0.0  # the fleet's offered requests a window, blended over reports (0: none)
    latest: float = 0.0  # the newest report's
    near_ms: int = -1  # the last time the pace was near MAX (-1: never)
    leasing: bool = False

    def report(self, offered: float) -> None:
        """A report's pace: `offered` requests a window across the fleet."""
        if not self.pace:
            self.pace = offered
        self.pace = TRAILING_PACE_WEIGHT * offered + (1 - TRAILING_PACE_WEIGHT) * self.pace
        self.latest = offered

    def choose(self, now_ms: int, limit: int, window_ms: int, near: tuple[float, float]) -> bool:
        """Whether the bucket is leased at `now_ms`; `near`: the blended pace and one report's,
        in MAX a window, from which a window is near."""
        blended, surge = near
        if self.pace >= blended * limit or self.latest >= surge * limit:
            self.near_ms = now_ms
        self.leasing = self.near_ms >= 0 and now_ms - self.near_ms < window_ms
        return self.leasing


def gateways(limiter: Limiter, state: KeyState | None) -> float:
    """The gateways a bucket's traffic stands for: its counter's `nodes` estimate, else the live
    nodes."""
    if state is not None and state.nodes.value > 0:
        return max(1.0, state.nodes.value)
    return float(max(1, limiter.live_nodes))
