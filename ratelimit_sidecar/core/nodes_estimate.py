"""The `nodes` estimate of a key: how many nodes' worth of the fleet's traffic one own hit
stands for. It is the inverse of this node's share of the key's traffic: 4 on an even split
over 4 nodes, 1.67 for a node that gets 60 %, 10 for one that gets 10 %. Every algorithm
learns it here, at span ends only (never on the request path), from finished windows: the
fleet's total of the window (the store's counter) against what this node counted in it.

One window alone is a poor sample (docs/ACCURACY.md, "The nodes estimate on boundary bursts"):
a window with a handful of requests makes the ratio noise (one own request among 117 said 117;
four among six would say 1.5), and a burst decided inside one span makes it wrong, not just
noisy. Nodes that pushed before a window crossed MAX are not told of the block, so they alone
admit the next window's first span, and from its total each of them sees a fleet of two. And
when every node refuses on its own estimate, the store counts none of the others' refusals: a
node that counts its own as offered sees 2.7 nodes of 4. An estimate that low lets every node
admit from memory far more than its share (the fixed window admitted 510 per window of 240).
So:

1. Sums, not one window's ratio: the fleet's totals and this node's admitted and refused
   counts are added up over the windows, halving the weight of the earlier ones at each new
   window (DECAY). A quiet window moves the ratio by its few requests, not to its own noise.
2. Offered, held up by admitted: the ratio is the fleet's total plus this node's refusals on
   its estimate over what this node was offered (bug 2: from admitted counts alone a node
   that refuses more than the others sees itself smaller, refuses more, and runs away). It
   may fall only as far as the admitted ratio, fleet total over own admitted, supports: that
   one is right when every node refuses alike, and it may not raise the estimate above the
   last one or the fleet's live node count (heartbeats), so bug 2 cannot run away through it.
   A node with more than an even share still learns its small estimate (60 % of 3: 1.67).
3. Falls on two windows' word: `nodes` is the larger of the last two windows' ratios. A
   single window that says the fleet shrank is not believed until the next one agrees;
   a larger fleet is believed at once. The first ratio replaces the guess of a new key
   (the live node count, which assumes an even split) at once.

Sliding windows learn from admitted counts only (see core/sliding_window.py): then 2. is the
plain ratio of the sums. Checks that must not refuse under the limit take the lower of the last
two estimates (`lower_of_last_two`).
"""

from __future__ import annotations

from ratelimit_sidecar.core.keystate import KeyState

DECAY = 0.5  # the weight an earlier window keeps at each new one


def learn_window(
    state: KeyState, total: int, admitted: int, rejected: int, live_nodes: int
) -> float:
    """Take in one finished window: the fleet's `total`, this node's `admitted` hits and the
    hits it `rejected` on its estimate alone (0 when refusals are not counted as offered).
    Returns the new `nodes`, for the algorithm's `set_nodes`."""
    state.fleet_sum = DECAY * state.fleet_sum + total
    state.admitted_sum = DECAY * state.admitted_sum + admitted
    state.rejected_sum = DECAY * state.rejected_sum + rejected
    ratio, last = _ratio(state, live_nodes), state.nodes_ratio  # 0 before the first ratio
    state.nodes_ratio = ratio
    return max(ratio, last)


def _ratio(state: KeyState, live_nodes: int) -> float:
    """Rule 2 on the sums: the offered ratio, held up by the admitted one within its cap."""
    fleet, admitted, rejected = state.fleet_sum, state.admitted_sum, state.rejected_sum
    offered = (fleet + rejected) / (admitted + rejected)
    if admitted <= 0:
        return max(1.0, offered)
    cap = max(state.nodes_ratio or state.nodes, live_nodes)
    return max(1.0, offered, min(fleet / admitted, cap))


def lower_of_last_two(state: KeyState) -> float:
    """`nodes` for a check that must not refuse requests under the limit: the lower of the
    last two estimates. Each is the larger of two windows' ratios, so this is about the middle
    of the last three: a single high window does not refuse, a single low one does not admit
    (a fixed window's lenient ceiling, a sliding window's check)."""
    return min(state.nodes, state.nodes_prev or state.nodes)
