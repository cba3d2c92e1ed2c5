"""A push the store answered as not applied fails alone: the fallback for that key, its count
kept for the next push (it was surely not counted), every other key synced as usual."""

from __future__ import annotations

from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    PushResult,
    SyncBatch,
    SyncResult,
    TotalRead,
)
from simulator.memory_store import MemoryStorage
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary
R = rule(rpu=100, spans=4)  # 1 s windows, 250 ms spans, share MAX / N = 25
WINDOW_MS = 1000
NOT_APPLIED = "WRONGTYPE Operation against a key holding the wrong kind of value"


def answered(batch: SyncBatch, store: MemoryStorage, failing: set[str]) -> SyncResult:
    """The store's answer, with the pushes of the keys whose value is in `failing` refused."""
    applied = SyncBatch(batch.now_ms, [p for p in batch.pushes if p.key[2] not in failing])
    result = store.execute(applied)
    answers = iter(result.pushes)
    pushes = tuple(
        PushResult(0, 0, NOT_APPLIED) if p.key[2] in failing else next(answers)
        for p in batch.pushes
    )
    return SyncResult(pushes, tuple(0 for _ in batch.total_reads), 1, 0)


def span(limiter: FleetLimiter, store: MemoryStorage, now: int, failing: set[str]) -> SyncResult:
    batch = limiter.end_span(now)
    result = answered(batch, store, failing)
    stats = limiter.apply_sync(now, batch, result)
    rows = zip(batch.pushes, result.pushes, strict=True)
    assert stats.failed_keys == len({push.key for push, answer in rows if answer.error})
    assert not stats.failed
    return result


def read(store: MemoryStorage, value: str, now: int) -> int:
    """The store's count of `value` in the window of `now`."""
    reads = [TotalRead(hit(R, value).key, now // WINDOW_MS)]
    return store.execute(SyncBatch(now, [], reads)).totals[0]


def test_a_not_applied_push_is_resent_once_and_never_counted_twice() -> None:
    limiter, store = FleetLimiter(), MemoryStorage()
    for value in ("a", "b"):
        limiter.hit(T0, [hit(R, value, hits=5)])
    span(limiter, store, T0 + 250, failing={"b"})
    assert read(store, "a", T0 + 250) == 5 and read(store, "b", T0 + 250) == 0
    assert limiter.pending_hits() == 5  # b's count waits for the next push
    for value in ("a", "b"):
        limiter.hit(T0 + 300, [hit(R, value, hits=2)])
    span(limiter, store, T0 + 500, failing=set())
    assert read(store, "a", T0 + 500) == 7 and read(store, "b", T0 + 500) == 7
    assert limiter.pending_hits() == 0


def test_a_key_that_keeps_failing_uses_the_fallback_and_others_sync() -> None:
    limiter, store = FleetLimiter(), MemoryStorage()
    for step in range(3):
        now = T0 + step * 250
        limiter.hit(now, [hit(R, "a", hits=30)])  # over the share of a span: the fallback blocks
        limiter.hit(now, [hit(R, "ok", hits=3)])
        span(limiter, store, now + 250, failing={"a"})
    a = limiter.keys.get(hit(R, "a").key)
    ok = limiter.keys.get(hit(R, "ok").key)
    assert a is not None and ok is not None
    assert a.blocked_until > T0 + 250  # the fallback's block, as when the whole sync fails
    assert (
        ok.blocked_until == 0 and ok.window_counts().seen == 9
    )  # the store's total, pushed every span
    assert read(store, "ok", T0 + 750) == 9
    assert limiter.hit(T0 + 760, [hit(R, "ok")]).code is Code.OK


def test_a_not_applied_fresh_push_falls_back_like_a_failed_sync() -> None:
    def after(failing: set[str]) -> tuple[float, int]:
        limiter, store = FleetLimiter(), MemoryStorage()
        limiter.hit(T0, [hit(R, "a", hits=10)])
        if failing:
            span(limiter, store, T0 + 250, failing)
        else:
            limiter.apply_sync(T0 + 250, limiter.end_span(T0 + 250), None)
        state = limiter.keys.get(hit(R, "a").key)
        assert state is not None
        return state.window_counts().ceiling, state.window_counts().seen

    assert after({"a"}) == after(set())  # same ceiling and `seen` as a failed sync gives


def test_an_orphans_not_applied_push_is_sent_again() -> None:
    limiter, store = FleetLimiter(max_keys=1), MemoryStorage()
    limiter.hit(T0, [hit(R, "a", hits=4)])
    limiter.hit(T0, [hit(R, "b", hits=1)])  # evicts a: its 4 hits go out as an orphan push
    batch = limiter.end_span(T0 + 250)
    result = answered(batch, store, failing={"a"})
    stats = limiter.apply_sync(T0 + 250, batch, result)
    assert (stats.failed_keys, stats.dropped_hits, stats.pushed_hits) == (1, 0, 1)
    again = limiter.end_span(T0 + 500)
    assert [(p.key[2], p.hits) for p in again.pushes if p.key[2] == "a"] == [("a", 4)]


def test_a_key_evicted_while_its_push_fails_sends_the_count_later() -> None:
    limiter = FleetLimiter(max_keys=1)
    limiter.hit(T0, [hit(R, "a", hits=5)])
    batch = limiter.end_span(T0 + 250)  # a's 5 hits are in flight
    limiter.hit(T0 + 260, [hit(R, "b", hits=1)])  # evicts a meanwhile
    limiter.apply_sync(T0 + 260, batch, None, resend=True)  # the push surely did not arrive
    assert limiter.pending_hits() == 6 and limiter.dropped_hits == 0
    again = limiter.end_span(T0 + 500)
    assert sorted((p.key[2], p.hits) for p in again.pushes) == [("a", 5), ("b", 1)]
