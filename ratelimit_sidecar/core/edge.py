"""Keys at the edge: a limit whose fleet could reach MAX before every node syncs again.

A limit with `consistency: edge` is decided from memory as an eventual one is, while the fleet
cannot reach MAX before its next span sync: the estimate of the window's count (the store's total
plus this node's unpushed hits, each standing for `nodes` nodes' worth) plus what the fleet adds
at the window's pace over `horizon_ms` (a span, plus a store round trip, late timers and clock
skew) stays under MAX. Past that margin the key is *at the edge* until its window ends:

- each admitted hit is pushed within `period_ms`: the time the fleet takes to add SLACK of MAX at
  the window's pace (at least MIN_PERIOD_MS, at most a span), or at once when own unpushed hits
  stand for SLACK of MAX (a burst). A key with nothing to push costs the store nothing; a blocked
  one admits nothing, hence pushes nothing.
- its pushes are announced on the near channel with the window's total, marked edge: every node
  hears the switch within a round trip, takes the total and pushes its own unpushed hits at once.
- its estimate counts own hits once and the others' as the fleet's pace over the age of the
  store's total (`others_since`), and may pass MAX by SLACK (`ceiling`): the lenient ceiling of
  core/fixed_window.py is for estimates a span old.

A new key's window may be at the edge already (a node that just joined, a client that moved):
past `new_key_push_at` own hits it pushes at once and learns the total; a key seen once pushes
nothing early. A limit under NEW_KEY_PER_NODE requests per live node (3 a minute on three
gateways) is at the edge from its first hit. When the store does not answer, the local
thresholds of the fallback decide, and nothing is pushed early. A counter fed by RLQS reports
is never at the edge (`KeyState.edge`): its gateways' usage reaches the store per report.

Sliding windows and token buckets have no window that fills and stays full: at twice their
limit they sit near MAX all the time, and pushing every SLACK of MAX would cost the store
nearly a call per request. Their own-hits-times-`nodes` estimate splits what frees up between
the nodes, which holds them near their exact reference; at the edge the rest of their error
is closed where it is made, with store work once a span at most:

- a key that never pushed (a node that just joined, a client that moved) reads the fleet's
  counts past `new_key_push_at` own hits (`first_read_due`);
- a span end's first answer lacks the pushes of the nodes that sync after this one (the first
  to push a span sees only its own hits): a key within reach of MAX (`reread_due`,
  `bucket_near`) reads again LATE_PUSH_MS later, once a span, and a bucket keeps its own
  projection until then;
- a fleet grown since the key's last answer raises its `nodes` at once
  (`NodesEstimate.grow`): learning from finished windows lags a window or two, while the
  joiners take their share again.
"""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.keystate import KeyState, WindowCounts
from ratelimit_sidecar.core.spancounts import Trailing

SLACK = 0.01  # the share of MAX the fleet may add between two pushes of a node at the edge
MIN_PERIOD_MS = 10  # the shortest time between two pushes of a key
HORIZON_EXTRA_MS = 100  # a store round trip, a late timer and clock skew, beyond the span
NOTICE_LAG_MS = 10  # from a push's hit to its notice at every node: a timer, a round trip
NEW_KEY_PER_NODE = 4  # a limit under this many requests per live node: at the edge at once
LATE_PUSH_MS = 20  # the other nodes' pushes of a span just ended land within this of the first
MIN_BUCKET_SPANS = 2  # a bucket holding fewer spans' refill is read at span ends only


def tiny(limit: RateLimit, live_nodes: int) -> bool:
    """Every gateway's first hits could pass it: no span of silence is safe."""
    return limit.requests_per_unit < NEW_KEY_PER_NODE * live_nodes


def new_key_push_at(limit: RateLimit) -> float:
    """A new key's own hits past this ask for a push: its window's total may be near MAX already
    (a client moving between gateways, a node that just joined), and a flood of keys seen once
    each pushes none of them early."""
    return max(1.0, SLACK * limit.requests_per_unit)


def stale_after_block(state: KeyState, unpushed: int, now_ms: int) -> bool:
    """A block ended after the store's total was last read (the caller checks that): the
    other nodes, or new ones, may have admitted up to MAX meanwhile. Past `new_key_push_at`
    hits the total is read again."""
    waiting = state.inflight or state.next_sync <= now_ms  # asked already
    return not waiting and unpushed > new_key_push_at(state.limit)


def horizon_ms(limit: RateLimit) -> int:
    """How long the fleet's hits may go unseen away from the edge: until every node's next span
    sync has been answered."""
    return limit.window_ms // limit.spans + HORIZON_EXTRA_MS


def estimate(state: KeyState, counts: WindowCounts) -> float:
    """The window's count for the fleet, as the check reads it."""
    unpushed = state.inflight + state.pending
    return counts.seen + counts.resumed + unpushed * state.nodes.value


def at_edge(state: KeyState, counts: WindowCounts, now_ms: int, live_nodes: int) -> bool:
    """The estimate plus the fleet's additions over the horizon, at the window's pace (measured
    over at least a horizon: a window's first hits are no pace), reach MAX."""
    return estimate(state, counts) >= edge_from(state, now_ms, live_nodes)


def edge_from(state: KeyState, now_ms: int, live_nodes: int) -> float:
    """The estimate from which the window is at the edge at `now_ms`. It only rises as the
    window goes on (the horizon weighs less against the time elapsed), so an estimate under
    it needs no check until it passes it (`WindowCounts.edge_from`)."""
    limit = state.limit
    if tiny(limit, live_nodes):
        return 0.0
    horizon = horizon_ms(limit)
    elapsed = now_ms - state.window * limit.window_ms
    return limit.requests_per_unit / (1 + horizon / max(elapsed, horizon))


def pace(state: KeyState, counts: WindowCounts, now_ms: int) -> float:
    """The fleet's hits per ms in this window, measured over at least a span's tenth."""
    limit = state.limit
    elapsed = now_ms - state.window * limit.window_ms
    return estimate(state, counts) / max(elapsed, limit.window_ms // (10 * limit.spans), 1)


def others_since(state: KeyState, counts: WindowCounts, now_ms: int) -> float:
    """What the other nodes added since the store's total at the edge: their share of the pace
    over the total's age (pushes and notices keep it young; `pending x nodes` would count a
    notice's hits again, and jump by `nodes` at each own hit)."""
    nodes = state.nodes.check
    # At the edge every node pushes what it admits within a period and the store announces it:
    # a total older than that has missed no more than a period's hits.
    age = min(max(0, now_ms - counts.seen_ms), period_ms(state, counts, now_ms) + NOTICE_LAG_MS)
    return pace(state, counts, now_ms) * age * (nodes - 1) / nodes


def enter(counts: WindowCounts, limit: RateLimit) -> None:
    """The window is at the edge until it ends."""
    counts.edge, counts.ceiling = True, ceiling(limit)


def ceiling(limit: RateLimit) -> float:
    """An estimate at the edge may pass MAX by SLACK of it: the store's total, a period old at
    most, refuses past MAX anyway (a count known over MAX blocks), and a stricter ceiling refuses
    the last requests of a window that ends at MAX."""
    return limit.requests_per_unit * (1 + SLACK)


def period_ms(state: KeyState, counts: WindowCounts, now_ms: int) -> int:
    """Between two pushes at the edge: the fleet adds about SLACK x MAX in that time."""
    limit = state.limit
    span = limit.window_ms // limit.spans
    fleet_pace = max(pace(state, counts, now_ms), 1 / span)
    return int(min(span, max(MIN_PERIOD_MS, SLACK * limit.requests_per_unit / fleet_pace)))


def push_due_ms(state: KeyState, counts: WindowCounts, now_ms: int) -> int:
    """When the hits just counted at the edge must be pushed: within a period after the last
    push, at once on a burst."""
    if state.pending * state.nodes.value >= SLACK * state.limit.requests_per_unit:
        return now_ms  # a burst: the fleet has added SLACK of MAX since the last push
    return max(now_ms, counts.pushed_ms + period_ms(state, counts, now_ms))


def first_read_due(state: KeyState, now_ms: int) -> bool:
    """A sliding window or bucket at the edge that has never pushed (a node that just joined, a
    client that moved here) reads the fleet's counts past `new_key_push_at` own hits: until its
    first span end it counts its own hits times `nodes`, which the fleet's may pass."""
    if state.inflight or state.next_sync <= now_ms:  # asked already
        return False
    return state.pending > new_key_push_at(state.limit)  # a key seen once: never early


def reread_due(limit: RateLimit, trailing: Trailing, pushed: float) -> bool:
    """After a span end's answer, a sliding window whose count plus what its pushed span adds
    again over the horizon reaches MAX: its spans are read again once the other nodes' pushes
    of that span are in (the first node to push a span sees only its own hits)."""
    added = pushed * horizon_ms(limit) * limit.spans / limit.window_ms
    return (
        trailing.scaled_count() + added * trailing.length
        >= limit.requests_per_unit * trailing.length
    )


def bucket_near(limit: RateLimit, tat: float, now_ms: int) -> bool:
    """A token bucket whose projected debt leaves less than a span's refill: one node's late
    push could empty it. Not a bucket under MIN_BUCKET_SPANS spans' refill: the store counts a
    span's hits as if at its end, so its debt there exceeds the truth by up to a span's refill,
    which a late push's absence offsets; read again, it refuses under the limit (more spans
    make such a bucket fit)."""
    span_refill = limit.window_ms * limit.requests_per_unit / limit.spans  # in ticks
    full = limit.capacity * limit.window_ms
    if full < MIN_BUCKET_SPANS * span_refill:
        return False
    return tat - now_ms * limit.requests_per_unit >= full - span_refill
