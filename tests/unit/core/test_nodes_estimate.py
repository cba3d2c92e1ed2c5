"""The `nodes` estimate (core/nodes_estimate.py): sums over windows, offered held up by
admitted, and a fall believed only when two windows agree."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.core import FleetLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.nodes_estimate import NodesEstimate
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary
RULE = rule(rpu=1000, spans=2)  # windows of 1 s, spans of 500 ms
LIMIT = RULE.limits[0]


def learnt(windows: list[tuple[int, int, int]], live_nodes: int = 4) -> NodesEstimate:
    """A key's estimate after `windows` of (own admitted, own rejected, fleet total)."""
    estimate = NodesEstimate(live_nodes)
    for window, (admitted, rejected, total) in enumerate(windows):
        estimate.admitted, estimate.refused = admitted, rejected
        estimate.roll(window, consecutive=True)
        estimate.learn(window, total, live_nodes)
    return estimate


def fleet_windows(windows: list[tuple[int, int]], live_nodes: int = 4) -> NodesEstimate:
    """Through a FleetLimiter: each (own, total) is a window with `own` admitted hits whose
    fleet total the store reports at the next window's first span end."""
    limiter = FleetLimiter()
    limiter.live_nodes = live_nodes
    totals = [total for _, total in windows]
    for k, (own, _) in enumerate([*windows, (0, 0)]):
        start = T0 + k * 1000
        for i in range(own):
            limiter.hit(start + i, [hit(RULE)])
        for end in (start + 500, start + 1000):
            batch = limiter.end_span(end)
            read = tuple(totals[k - 1] for _ in batch.total_reads)
            pushes = tuple(PushResult(0, 0) for _ in batch.pushes)
            limiter.apply_sync(end, batch, SyncResult(pushes, read, live_nodes=live_nodes))
    state: KeyState | None = limiter.keys.get(hit(RULE).key)
    assert state is not None
    return state.nodes


def test_a_quiet_window_with_a_handful_of_requests_does_not_drop_nodes() -> None:
    # Two windows of 60 own hits in 240 say 4 nodes; then 4 own hits in a window of 6. On
    # that window's word alone (the rule before) nodes was 1.5, and each own hit of the next
    # window stood for 1.5 instead of 4.
    state = fleet_windows([(60, 240), (60, 240), (4, 6)])
    assert state.value == 4.0


def test_a_window_weighs_by_its_requests() -> None:
    state = learnt([(60, 0, 240), (1, 0, 117)])  # one own request among 117: not 117 nodes
    assert state.value == pytest.approx((120 + 117) / (30 + 1))


def test_one_low_window_is_not_believed_until_the_next_agrees() -> None:
    # Nodes that were not told of a block admit a window's start alone: each sees 2 of 4.
    state = learnt([(60, 0, 240), (90, 0, 180)])
    assert state.value == 4.0
    assert state.ratio == pytest.approx(300 / 120)


def test_a_fleet_that_really_shrank_is_followed_within_a_few_windows() -> None:
    state = learnt([(60, 0, 240)] + [(90, 0, 180)] * 6, live_nodes=2)
    assert state.value == pytest.approx(2.0, rel=0.05)


def test_a_larger_fleet_is_believed_at_once() -> None:
    assert learnt([(120, 0, 240), (30, 0, 240)]).value == pytest.approx((120 + 240) / (60 + 30))


def test_a_new_key_takes_its_first_ratio_at_once() -> None:
    # The guess of a new key (the live node count) assumes an even split: a node with 60 %
    # of the traffic must not keep it for a second window.
    assert learnt([(144, 0, 240)], live_nodes=3).value == pytest.approx(240 / 144)


def test_when_every_node_refuses_alike_the_admitted_ratio_holds_nodes_up() -> None:
    # Each of 4 nodes admitted 60 and refused 48 on its estimate; the store counts admitted
    # hits only, so the offered ratio says (240 + 48) / 108 = 2.7. Admitted, 240 / 60 = 4.
    state = learnt([(60, 0, 240), (60, 48, 240)])
    assert state.value == 4.0


def test_refusals_on_the_estimate_cannot_run_nodes_away() -> None:
    # A node that refuses more than the others looks small by its admitted count
    # ((120 + 120) / (60 + 10) = 3.4 over the sums). The admitted ratio never lifts the
    # estimate past the last one (2) or the live node count; the offered ratio, which counts
    # the refusals on both sides, may: (240 + 30) / (70 + 30) = 2.7.
    state = learnt([(120, 0, 240), (10, 30, 120)], live_nodes=0)
    assert state.value == pytest.approx(2.7)


def test_a_sliding_windows_check_takes_the_lower_of_the_last_two_estimates() -> None:
    # It has no lenient ceiling: one window whose share looked small by chance (a high
    # estimate) must not refuse requests under the limit.
    state = learnt([])
    state.caution(True)  # what a sliding window's key starts with
    state.set(4.0)
    state.set(5.0)
    assert (state.value, state.check) == (5.0, 4.0) == (5.0, state.lower_of_last_two())
