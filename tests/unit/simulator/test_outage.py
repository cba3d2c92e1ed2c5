"""Store outage: the fallback bound while it is down, and recovery once it is back."""

from __future__ import annotations

from simulator.engine import KEY
from tests.unit.simulator.helpers import engine, rejections

OUTAGE_AT, OUTAGE_WINDOWS = 10, 8  # windows of 10 s


def test_admissions_stay_within_the_fallback_bound_while_the_store_is_down() -> None:
    """Bound: every window, node i admits at most (MAX + N) / nodes_i.

    Why: during an outage each failed push adds int(count x nodes) to `seen` (the core's
    fallback), and the request path admits only while seen + (pending + 1) x nodes <= MAX,
    so a node's own window count times its `nodes` stays under MAX (+1 lost per span to the
    int()). `nodes` cannot change while the store is down, so the fleet's bound is the sum.
    Twice the limit is offered, so the bound is what holds the load back."""
    end = OUTAGE_AT + OUTAGE_WINDOWS
    outage = (OUTAGE_AT * 10_000, end * 10_000)
    eng, setup = engine("core", scenario="steady", windows=end, outage=outage)
    rec = eng.run()  # the run ends with the outage, so each node's `nodes` is its outage value
    p = setup.params
    shares = [node.limiter.keys.get(KEY) for node in eng.nodes.values()]
    bound = sum((p.max + p.spans) / s.nodes.value for s in shares if s is not None)
    assert bound < 1.5 * p.max  # meaningful: well under the 2 x MAX offered
    for w in range(OUTAGE_AT, end):
        assert rec.admitted[w] <= bound, (w, rec.admitted[w], bound)
        assert rec.offered[w] > 1.5 * p.max


def test_every_node_syncs_with_the_store_again_within_one_span() -> None:
    outage = (OUTAGE_AT * 10_000, (OUTAGE_AT + 2) * 10_000)
    eng, setup = engine("core", scenario="steady", windows=OUTAGE_AT + 4, outage=outage)
    back = setup.start_ms + outage[1]
    first_ok: dict[int, int] = {}
    apply = eng._apply

    def spy(node):
        if node.answer is not None and eng.now >= back:
            first_ok.setdefault(node.index, eng.now)
        apply(node)

    eng._apply = spy  # type: ignore[method-assign]
    eng.run()
    assert sorted(first_ok) == sorted(eng.nodes)
    assert max(first_ok.values()) - back <= setup.params.span_ms + 10  # + wake jitter


def test_decisions_are_normal_one_span_after_a_short_outage() -> None:
    # Two spans down at 30% of the limit: nothing should be rejected once the store is back.
    start = OUTAGE_AT * 10_000 + 3_000
    got, setup = rejections(
        "core", scenario="steady", load=0.3, windows=OUTAGE_AT + 6, outage=(start, start + 3_400)
    )
    back = setup.start_ms + start + 3_400
    assert [t for t, _ in got if t >= back + setup.params.span_ms] == []


def test_decisions_are_normal_one_span_after_a_long_outage() -> None:
    """Two windows down at 30% of the limit.

    The core before the fix of bug 1 (docs/ACCURACY.md) failed this: it re-added the stashed
    hits to `seen` at every failed span, blocked every node for a cooldown during the outage,
    and the blocks outlived the outage."""
    outage = (OUTAGE_AT * 10_000, (OUTAGE_AT + 2) * 10_000)
    got, setup = rejections(
        "core", scenario="steady", load=0.3, windows=OUTAGE_AT + 6, outage=outage
    )
    back = setup.start_ms + outage[1]
    assert [t for t, _ in got if t >= back + setup.params.span_ms] == []
