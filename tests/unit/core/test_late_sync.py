"""A sync that runs late, after the span end it is for: the hits of the span that ended stay in
that span at the store (core/fleet.py `push_span`), so a fleet under MAX is never refused."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, SyncResult
from ratelimit_sidecar.core.fleet import push_span
from tests.unit.core.rules import hit
from tests.unit.core.trailing import T0, WINDOW, SpanStore

SPAN_MS, SHARES = 500, (0.6, 0.3, 0.1)
LIMIT = RateLimit(60, Unit.SECOND, 2, spans=4, algorithm=WINDOW)  # 2 s in spans of 500 ms
RULE = Rule("d", (("k", ""),), LIMIT)


def fleet_of_three() -> list[FleetLimiter]:
    nodes = []
    for _ in SHARES:
        node = FleetLimiter()
        node.apply_sync(T0, node.end_span(T0), SyncResult(live_nodes=len(SHARES)))
        nodes.append(node)
    return nodes


def refused_at_80_percent(late_ms: int, seconds: int = 40) -> list[int]:
    """Times of refusals: paced requests at 80 % of MAX, 60/30/10 %, each node syncing
    `late_ms` after every span end (one after the other, as their loops wake)."""
    nodes, store = fleet_of_three(), SpanStore()
    events: list[tuple[int, int, int]] = []  # (time, 0 request / 1 sync, node)
    for index, share in enumerate(SHARES):
        gap = 1000 / (0.8 * LIMIT.requests_per_unit / 2 * share)
        events += [
            (int(T0 + 1000 + index * 7 + k * gap), 0, index)
            for k in range(int(seconds * 1000 / gap))
        ]
    for end in range(T0 + SPAN_MS, T0 + seconds * 1000, SPAN_MS):
        events += [(end + late_ms + index, 1, index) for index in range(len(SHARES))]
    refused = []
    for now, kind, index in sorted(events):
        node = nodes[index]
        if kind:
            batch = node.end_span(now)
            node.apply_sync(now, batch, store.execute(batch, live_nodes=len(SHARES)))
        elif node.hit(now, [hit(RULE)]).code is not Code.OK:
            refused.append(now)
    return refused


@pytest.mark.parametrize("late_ms", [0, 30, 100])
def test_a_fleet_at_80_percent_is_not_refused_when_syncs_run_late(late_ms: int) -> None:
    # (the first window, before the nodes have learnt their shares, is not the point here)
    settled = [t for t in refused_at_80_percent(late_ms) if t >= T0 + 3000 + 2 * 2000]
    assert settled == []  # before push_span: 56 of 1417 refused at 30 ms late, 89 at 100 ms


def test_a_late_sync_pushes_into_the_span_that_ended() -> None:
    node = FleetLimiter()
    start = T0 + 2 * SPAN_MS  # the third span of a window
    node.hit(start + 100, [hit(RULE)])
    (state,) = node.keys
    ended = start + SPAN_MS
    node.hit(ended + 5, [hit(RULE)])  # counted before the sync for `ended` ran
    assert push_span(state, ended, ended + 20) == T0 // SPAN_MS + 2
    assert push_span(state, ended + SPAN_MS, ended + 20) == T0 // SPAN_MS + 3  # a flush
    node.hit(ended + SPAN_MS + 5, [hit(RULE)])  # the first span of the next window: its own
    assert push_span(state, ended + SPAN_MS, ended + SPAN_MS + 20) == T0 // SPAN_MS + 4
