"""The short path of the limiter (`Limiter.admit`, taken by `hit` for one descriptor and by the
handler for one counted descriptor among others) must decide exactly as the general path does;
requests with companions check that `hit` answers them like the general path too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import Code, Decision, Hit, Limiter, PushResult, SyncResult
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


class GeneralOnly(Limiter):
    """A limiter whose every request takes the general (several-descriptor) path."""

    def hit(self, now_ms: int, hits: list[Hit]) -> Decision:  # type: ignore[override]
        return self._hit_all(now_ms, hits)


def snapshot(limiter: Limiter) -> list[dict[str, object]]:
    return [state.snapshot() for state in limiter.keys]


# One step: advance the clock by `dt` ms, then either send a request (rule index, value, hits)
# or end a span with the store confirming a global total of `seen` for every key.
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
def test_fast_paths_match_the_general_path(
    script: list[tuple[int, tuple[int, str, int, int, bool]]], max_keys: int, shared: bool
) -> None:
    # A small table also exercises eviction and the untracked decision of a full table.
    fast = Limiter(max_keys, shared_store=shared)
    general, now = GeneralOnly(max_keys, shared_store=shared), T0
    for dt, (index, value, count, companions, first) in script:
        now += dt
        if index < 0:
            for limiter in (fast, general):
                batch = limiter.end_span(now)
                pushes = tuple(PushResult(count, 0) for _ in batch.pushes)
                totals = tuple(count for _ in batch.total_reads)
                nodes = 1 + count % 3 if shared else 0  # new keys start from this estimate
                result = SyncResult(pushes=pushes, totals=totals, live_nodes=nodes)
                limiter.apply_sync(now, batch, result)
            continue
        counted, others = hit(RULES[index], value, count), list(COMPANIONS[companions])
        request = [counted, *others] if first else [*others, counted]
        assert fast.hit(now, request) == general.hit(now, request)
        assert snapshot(fast) == snapshot(general)
    assert fast.dropped_hits == general.dropped_hits
    assert (fast.untracked, fast.keys.evictions) == (
        general.untracked,
        general.keys.evictions,
    )
    assert fast.pending_hits() == general.pending_hits()


def test_fast_path_is_taken_for_a_tracked_key_and_a_new_one() -> None:
    limiter, r = Limiter(max_keys=2), rule(rpu=3)

    def no_general_path(now_ms: int, hits: list[Hit]) -> Decision:
        raise AssertionError("general path used for an admitted key")

    limiter._hit_all = no_general_path  # type: ignore[method-assign, assignment]
    limiter.hit(T0, [hit(r)])  # first sight, with room in the table
    verdict = limiter.hit(T0 + 1, [hit(r)]).verdicts[0]
    assert (verdict.remaining, verdict.reset_ms) == (1, 999)
    assert limiter.admit(T0 + 2, hit(r, "b")) is not None  # the table is now full
    assert limiter.admit(T0 + 3, hit(r, "c")) is not None  # evicts the oldest for room
    assert limiter.keys.evictions == 1


def test_a_table_full_of_blocked_keys_leaves_a_new_key_to_the_general_path() -> None:
    limiter, r = Limiter(max_keys=1), rule(rpu=1)
    limiter.hit(T0, [hit(r, "a")])
    assert limiter.hit(T0, [hit(r, "a")]).code is Code.OVER_LIMIT  # blocked: never evicted
    assert limiter.admit(T0 + 1, hit(r, "b")) is None
    assert limiter.untracked == 0  # counted where the untracked decision is made
    assert limiter.hit(T0 + 1, [hit(r, "b")]).code is Code.OK
    assert (limiter.untracked, len(limiter.keys)) == (1, 1)
