"""The lenient ceiling of the request check (core/fixed_window.py).

MAX 120 per second, 4 spans of 250 ms: MAX / N = 30 and the bound MAX x (1 + 1/N) = 150.
"""

from __future__ import annotations

from ratelimit_sidecar.core import Code, FleetLimiter, PushResult, SyncResult
from ratelimit_sidecar.core.keystate import KeyState
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary
RULE = rule(rpu=120, spans=4)


def synced(total: int, nodes: int = 4, own: int = 1) -> tuple[FleetLimiter, KeyState]:
    """A key with `own` hits in its first span, then a sync at its end answering `total`."""
    limiter = FleetLimiter(new_keys_alone=False)  # the estimate from the first hit
    limiter.live_nodes = nodes
    for _ in range(own):
        limiter.hit(T0, [hit(RULE)])
    limiter.apply_sync(T0 + 250, limiter.end_span(T0 + 250), SyncResult((PushResult(total, 0),)))
    state = limiter.keys.get(hit(RULE).key)
    assert state is not None
    return limiter, state


def test_a_window_on_course_past_the_bound_keeps_the_strict_check() -> None:
    _, state = synced(total=40)  # 40 in a quarter: on course for 160 > 150
    assert state.window_counts().ceiling == 120


def test_a_window_under_its_pace_bound_lets_the_estimate_pass_max_by_the_distance() -> None:
    assert (
        synced(total=35)[1].window_counts().ceiling == 130
    )  # on course for 140: 10 under the bound
    assert synced(total=10)[1].window_counts().ceiling == 150  # far under: MAX / N at most


def test_a_lenient_ceiling_still_refuses_what_passes_it_and_never_blocks() -> None:
    limiter, state = synced(total=10)  # ceiling 150; each hit stands for 4
    codes = [limiter.hit(T0 + 300, [hit(RULE)]).code for _ in range(36)]
    assert codes == [Code.OK] * 35 + [Code.OVER_LIMIT]  # 10 + 35 x 4 = 150
    assert state.blocked_until == 0


def test_a_small_share_gets_room_for_its_own_noise() -> None:
    # nodes 10 and 4 own hits per span: 3 sd of the extrapolation is 3 x 10 x 2 = 60 > 30.
    assert synced(total=30, nodes=10, own=4)[1].window_counts().ceiling == 180


def test_the_first_sync_of_a_window_keeps_the_ceiling_and_a_failed_one_is_strict() -> None:
    limiter, state = synced(total=35)
    for now in (T0 + 500, T0 + 750):
        limiter.apply_sync(now, limiter.end_span(now), SyncResult((PushResult(35, 0),)))
    assert state.window_counts().ceiling == 150  # 35 in three quarters: on course for 47
    limiter.apply_sync(T0 + 1000, limiter.end_span(T0 + 1000), SyncResult((PushResult(0, 0),)))
    assert state.window_counts().ceiling == 150  # a new window: no pace yet
    limiter.apply_sync(T0 + 1250, limiter.end_span(T0 + 1250), None)
    assert state.window_counts().ceiling == 120


def test_a_lenient_check_takes_the_lower_of_the_last_two_nodes_estimates() -> None:
    limiter, state = synced(total=10)
    state.nodes.set(4.0)
    state.nodes.set(9.0)  # one window's share can look small
    assert state.nodes.check == 4.0
    limiter.apply_sync(T0 + 500, limiter.end_span(T0 + 500), None)  # a failed sync
    assert state.nodes.check == 9.0
