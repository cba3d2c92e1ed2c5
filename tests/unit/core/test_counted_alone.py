"""The handler decides a request with one counted descriptor by asking the limiter about that
descriptor alone (the others' answers never change). That must decide exactly as the whole
request would: same code, same verdict for the counted descriptor, same counters afterwards."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import (
    Code,
    Decision,
    FleetLimiter,
    Hit,
    Limiter,
    LocalLimiter,
    PushResult,
    SyncResult,
)
from ratelimit_sidecar.core.keystate import KeyState
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000
RULES = (rule(rpu=5, cooldown_ms=300), rule(rpu=1, key="x"), rule(rpu=40, spans=4, key="y"))
UNLIMITED = Rule("d", (("u", ""),), None, unlimited=True)
# Descriptors sent beside the counted one: none, unmatched, unlimited, or a second counted one.
COMPANIONS: tuple[tuple[Hit, ...], ...] = (
    (),
    (hit(None, "n"),),
    (hit(UNLIMITED, "u"), hit(None, "n")),
    (hit(RULES[1], "b"),),
)


def snapshot(limiter: Limiter) -> list[dict[str, object]]:
    return [state.snapshot() for state in limiter.keys]


def end_span(limiter: Limiter, now: int, total: int) -> None:
    """A span end: the store confirms `total` for every key (local-only: a sweep)."""
    if isinstance(limiter, LocalLimiter):
        limiter.sweep(now)
        return
    assert isinstance(limiter, FleetLimiter)
    batch = limiter.end_span(now)
    pushes = tuple(PushResult(total, 0) for _ in batch.pushes)
    totals = tuple(total for _ in batch.total_reads)
    nodes = 1 + total % 3  # new keys start from this estimate
    limiter.apply_sync(now, batch, SyncResult(pushes=pushes, totals=totals, live_nodes=nodes))


# One step: advance the clock by `dt` ms, then either send a request (rule index, value, hits,
# companions, counted first) or end a span with the store confirming a total for every key.
steps = st.lists(
    st.tuples(
        st.integers(0, 400),
        st.one_of(
            st.tuples(
                st.integers(0, 2),
                st.sampled_from("abc"),
                st.integers(-1, 3),
                st.integers(0, len(COMPANIONS) - 1),
                st.booleans(),
            ),
            st.tuples(st.just(-1), st.just(""), st.integers(0, 60), st.just(0), st.just(False)),
        ),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.sampled_from([2, 4, 100]), st.booleans())
def test_the_counted_descriptor_alone_decides_as_the_whole_request(
    script: list[tuple[int, tuple[int, str, int, int, bool]]], max_keys: int, shared: bool
) -> None:
    # A small table also exercises eviction and the untracked decision of a full table.
    kind = FleetLimiter if shared else LocalLimiter
    alone, whole, now = kind(max_keys), kind(max_keys), T0
    kept: dict[tuple[int, str], KeyState | None] = {}  # evicted or removed ones too, as a cache
    for dt, (index, value, count, companions, first) in script:
        now += dt
        if index < 0:
            end_span(alone, now, count)
            end_span(whole, now, count)
            continue
        counted, others = hit(RULES[index], value, count), list(COMPANIONS[companions])
        request = [counted, *others] if first else [*others, counted]
        at = 0 if first else len(others)
        single = companions != 3  # a second counted descriptor: the handler sends it all
        if single:  # the handler's one fast path, handed back the counter it returned last
            verdict, kept[index, value] = alone.hit_one(now, *counted, kept.get((index, value)))
            mine = Decision(verdict.code, (verdict,))
        else:
            mine = alone.hit(now, request)
        theirs = whole.hit(now, request)
        assert mine.code is theirs.code
        assert mine.verdicts[0 if single else at] == theirs.verdicts[at]
        assert snapshot(alone) == snapshot(whole)
    assert alone.dropped_hits == whole.dropped_hits
    assert (alone.untracked, alone.keys.evictions) == (whole.untracked, whole.keys.evictions)


def test_a_table_full_of_blocked_keys_decides_a_new_key_untracked() -> None:
    limiter, r = FleetLimiter(max_keys=1), rule(rpu=1)
    limiter.hit(T0, [hit(r, "a")])
    assert limiter.hit(T0, [hit(r, "a")]).code is Code.OVER_LIMIT  # blocked: never evicted
    assert limiter.hit(T0 + 1, [hit(r, "b")]).code is Code.OK
    assert (limiter.untracked, len(limiter.keys)) == (1, 1)
