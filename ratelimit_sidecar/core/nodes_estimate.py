"""The `nodes` estimate of a key: how many nodes' worth of the fleet's traffic one own hit stands
for, the inverse of this node's share (4 on an even split over 4 nodes, 1.67 at 60 %, 10 at
10 %). Every algorithm learns it here, at span ends only, from finished windows: the fleet's
total (the store's counter) against what this node counted.

One window alone is a poor sample (docs/ACCURACY.md, "The nodes estimate on boundary bursts"):
a handful of requests makes the ratio noise, a burst inside one span makes it wrong, and when
every node refuses on its own estimate the store counts none of the others' refusals, so a node
counting its own as offered sees too small a fleet, and too low an estimate admits far more
than its share. So:

1. Sums, not one window's ratio: the fleet's totals and own admitted and refused counts are
   summed over windows, the earlier ones' weight halved at each new window (DECAY).
2. Offered, held up by admitted: the ratio is (fleet total + own refusals on the estimate) over
   own offered (from admitted counts alone a node refusing more than the others sees itself
   smaller, refuses more, and runs away). It may fall only as far as the admitted ratio, fleet
   total over own admitted, supports: right when every node refuses alike, and capped at the
   last estimate or the live node count (heartbeats), so it cannot run away either. A node
   with more than an even share still learns its small estimate (60 % of 3: 1.67).
3. Falls on two windows' word: `nodes` is the larger of the last two windows' ratios; a larger
   fleet is believed at once. The first ratio replaces a new key's guess (the live node count,
   an even split) at once.

Sliding windows count no refusals as offered: 2. is then the plain ratio of the sums. A
`cautious` check (a lenient fixed window, every sliding window) scales own hits by the lower of
the last two estimates (`check`). The sync plan hands in a window's fleet total (`learn`).
"""

from __future__ import annotations

from typing import Final

NO_WINDOW: Final = -1  # a constant, read at every roll
DECAY = 0.5  # the weight an earlier window keeps at each new one


class NodesEstimate:
    __slots__ = (
        "admitted",
        "admitted_sum",
        "cautious",
        "check",
        "fleet_sum",
        "live",
        "prev",
        "ratio",
        "refused",
        "refused_sum",
        "value",
        "window",
        "window_admitted",
        "window_refused",
    )

    def __init__(self, nodes: float) -> None:
        self.value = nodes  # the estimate
        self.check = nodes  # what a request check scales own hits by (`cautious`: the lower)
        self.cautious = False
        self.prev = 0.0  # the estimate before the last one; 0 until there are two
        self.ratio = 0.0  # the last window's ratio; 0 until there is one
        self.fleet_sum = self.admitted_sum = self.refused_sum = 0.0  # decayed sums (rule 1)
        self.admitted = 0  # own hits admitted in the key's current window
        self.refused = 0  # ... and refused on the estimate alone (offered, not admitted)
        self.window = NO_WINDOW  # a finished window whose fleet total is still wanted
        self.window_admitted = self.window_refused = 0  # own counts of that window
        self.live = 0  # the live node count when the key started, or `grow` last saw it

    def roll(self, window: int, consecutive: bool) -> None:
        """Keep `window`'s own counts for the fleet's total, if it was the one just before."""
        offered = self.admitted + self.refused
        self.window = window if consecutive and offered else NO_WINDOW
        self.window_admitted, self.window_refused = self.admitted, self.refused
        self.admitted = self.refused = 0

    def learn(self, window: int, total: int, live_nodes: int) -> None:
        """Refusals under a block are not counted: it hits nodes alike, or rule 3 copes."""
        offered = self.window_admitted + self.window_refused
        if window == self.window and offered > 0 and total > 0:
            self.set(self._learn_window(total, live_nodes))
        self.window = NO_WINDOW

    def set(self, nodes: float) -> None:
        self.prev = self.value if self.prev else nodes
        self.value = nodes
        self.check = self.lower_of_last_two() if self.cautious else nodes

    def grow(self, live_nodes: int) -> None:
        """The fleet grew since the last call: a balancer spreads this key's traffic over the
        new nodes too, so this node's share falls as live / new live (believed at once, as any
        larger fleet; a key pinned to this node refuses early until its next window teaches
        it). Learning from finished windows alone lags a window or two, and a trailing limit
        meanwhile admits the joiners' share again (core/edge.py)."""
        live, self.live = self.live, live_nodes
        if 0 < live < live_nodes:
            scale = live_nodes / live
            self.value, self.check, self.prev = (
                self.value * scale,
                self.check * scale,
                self.prev * scale,
            )
            # The windows learnt so far count the larger fleet too, or the next one undoes it.
            self.ratio, self.fleet_sum = self.ratio * scale, self.fleet_sum * scale

    def guess(self, nodes: float) -> None:
        """A new key's estimate before it has learnt one (core/quiet_keys.py)."""
        self.value = self.check = nodes

    def caution(self, cautious: bool) -> None:
        self.cautious = cautious
        self.check = self.lower_of_last_two() if cautious else self.value

    def lower_of_last_two(self) -> float:
        """About the middle of the last three ratios: no single window refuses or admits."""
        return min(self.value, self.prev or self.value)

    def _learn_window(self, total: int, live_nodes: int) -> float:
        """Rules 1 and 3."""
        self.fleet_sum = DECAY * self.fleet_sum + total
        self.admitted_sum = DECAY * self.admitted_sum + self.window_admitted
        self.refused_sum = DECAY * self.refused_sum + self.window_refused
        ratio, last = self._ratio(live_nodes), self.ratio  # 0 before the first ratio
        self.ratio = ratio
        return max(ratio, last)

    def _ratio(self, live_nodes: int) -> float:
        """Rule 2."""
        fleet, admitted, refused = self.fleet_sum, self.admitted_sum, self.refused_sum
        offered = (fleet + refused) / (admitted + refused)
        if admitted <= 0:
            return max(1.0, offered)
        cap = max(self.ratio or self.value, live_nodes)
        return max(1.0, offered, min(fleet / admitted, cap))
