"""The `nodes` estimate of a key: how many nodes' worth of the fleet's traffic one own hit
stands for. It is the inverse of this node's share of the key's traffic: 4 on an even split
over 4 nodes, 1.67 for a node that gets 60 %, 10 for one that gets 10 %. Every algorithm
learns it here, at span ends only (never on the request path), from finished windows: the
fleet's total of the window (the store's counter) against what this node counted in it.

One window alone is a poor sample (docs/ACCURACY.md, "The nodes estimate on boundary bursts"):
a window with a handful of requests makes the ratio noise, and a burst decided inside one span
makes it wrong, not just noisy. Nodes that pushed before a window crossed MAX are not told of
the block, so they alone admit the next window's first span, and from its total each of them
sees a fleet of two. And when every node refuses on its own estimate, the store counts none of
the others' refusals, so a node that counts its own as offered sees too small a fleet. An
estimate that low lets every node admit from memory far more than its share. So:

1. Sums, not one window's ratio: the fleet's totals and this node's admitted and refused
   counts are added up over the windows, halving the weight of the earlier ones at each new
   window (DECAY). A quiet window moves the ratio by its few requests, not to its own noise.
2. Offered, held up by admitted: the ratio is the fleet's total plus this node's refusals on
   its estimate over what this node was offered (from admitted counts alone a node that
   refuses more than the others sees itself smaller, refuses more, and runs away). It
   may fall only as far as the admitted ratio, fleet total over own admitted, supports: that
   one is right when every node refuses alike, and it may not raise the estimate above the
   last one or the fleet's live node count (heartbeats), so that cannot run away through it.
   A node with more than an even share still learns its small estimate (60 % of 3: 1.67).
3. Falls on two windows' word: `nodes` is the larger of the last two windows' ratios. A
   single window that says the fleet shrank is not believed until the next one agrees;
   a larger fleet is believed at once. The first ratio replaces the guess of a new key
   (the live node count, which assumes an even split) at once.

Sliding windows count no refusals as offered (see core/sliding_window.py): then 2. is the plain
ratio of the sums. A `cautious` check (a fixed window's lenient ceiling, every sliding window)
scales own hits by the lower of the last two estimates instead (`check`).

Each key has one `NodesEstimate`: the algorithm counts its own admitted and refused hits into
it, the key's window roll closes a window's counts, and the sync plan hands it the fleet's total
of that window (`learn`).
"""

from __future__ import annotations

NO_WINDOW = -1
DECAY = 0.5  # the weight an earlier window keeps at each new one


class NodesEstimate:
    """One key's estimate, what it is learnt from, and the node's own counts of the window."""

    __slots__ = (
        "admitted",
        "admitted_sum",
        "cautious",
        "check",
        "fleet_sum",
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

    def roll(self, window: int, consecutive: bool) -> None:
        """The key moved on from `window`: keep its own counts until the fleet's total comes
        (only for the window just before the new one: an older total says nothing now)."""
        offered = self.admitted + self.refused
        self.window = window if consecutive and offered else NO_WINDOW
        self.window_admitted, self.window_refused = self.admitted, self.refused
        self.admitted = self.refused = 0

    def learn(self, window: int, total: int, live_nodes: int) -> None:
        """The fleet's `total` of the finished `window` against this node's count in it
        (`live_nodes`: the store's heartbeat count, 0 if unknown). Hits refused by a block are
        not counted (a block mostly hits every node alike; when it does not, rule 3 copes)."""
        offered = self.window_admitted + self.window_refused
        if window == self.window and offered > 0 and total > 0:
            self.set(self._learn_window(total, live_nodes))
        self.window = NO_WINDOW

    def set(self, nodes: float) -> None:
        """Take a new estimate."""
        self.prev = self.value if self.prev else nodes
        self.value = nodes
        self.check = self.lower_of_last_two() if self.cautious else nodes

    def caution(self, cautious: bool) -> None:
        """Scale a request check's own hits by the lower of the last two estimates, or not."""
        self.cautious = cautious
        self.check = self.lower_of_last_two() if cautious else self.value

    def lower_of_last_two(self) -> float:
        """The estimate for a check that must not refuse requests under the limit. Each
        estimate is the larger of two windows' ratios, so this is about the middle of the last
        three: a single high window does not refuse, a single low one does not admit."""
        return min(self.value, self.prev or self.value)

    def _learn_window(self, total: int, live_nodes: int) -> float:
        """Rules 1 and 3: add the window to the sums; the larger of the last two ratios."""
        self.fleet_sum = DECAY * self.fleet_sum + total
        self.admitted_sum = DECAY * self.admitted_sum + self.window_admitted
        self.refused_sum = DECAY * self.refused_sum + self.window_refused
        ratio, last = self._ratio(live_nodes), self.ratio  # 0 before the first ratio
        self.ratio = ratio
        return max(ratio, last)

    def _ratio(self, live_nodes: int) -> float:
        """Rule 2 on the sums: the offered ratio, held up by the admitted one within its cap."""
        fleet, admitted, refused = self.fleet_sum, self.admitted_sum, self.refused_sum
        offered = (fleet + refused) / (admitted + refused)
        if admitted <= 0:
            return max(1.0, offered)
        cap = max(self.ratio or self.value, live_nodes)
        return max(1.0, offered, min(fleet / admitted, cap))
