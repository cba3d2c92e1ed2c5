"""The sliding log (core/sliding_log.py) on a fake clock: in local-only mode every decision,
remaining, reset and Retry-After equals the exact log's; a fleet node decides the key as a
sliding window."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, LocalLimiter
from ratelimit_sidecar.core.keystate import WindowCounts
from ratelimit_sidecar.core.local import IDLE_MS
from simulator.exact.sliding_log import ExactSlidingLog
from tests.unit.core.rules import hit, rule
from tests.unit.core.trailing import (
    LOG,
    T0,
    WINDOW,
    boundary_bursts,
    random_trace,
    span_end_bursts,
    trailing_rule,
    worst_trailing_count,
)


def replay(limiter: LocalLimiter, r: Rule, trace: list[tuple[int, int]]) -> list[int]:
    """Every request of `trace` to `limiter` and to the exact log: same decision, remaining,
    reset and Retry-After. Returns the times of admitted hits."""
    assert r.limit is not None
    exact = ExactSlidingLog(r.limit.requests_per_unit, r.limit.window_ms)
    admitted: list[int] = []
    for now, hits in trace:
        wait = None if exact.allows(now, hits) else exact.wait_ms(now, hits)
        verdict = limiter.hit(now, [hit(r, hits=hits)]).verdicts[0]
        assert (verdict.code is Code.OK) == exact.hit(now, hits), (now - T0, hits)
        if verdict.code is Code.OK:
            admitted += [now] * hits
            assert verdict.remaining == r.limit.requests_per_unit - exact.count(now)
            assert verdict.reset_ms == exact.reset_ms(now)
        else:
            assert verdict.reset_ms == (wait if wait is not None else r.limit.window_ms)
    return admitted


@pytest.mark.parametrize("seed", range(10))
def test_decisions_equal_the_exact_log_on_random_traces(seed: int) -> None:
    r = trailing_rule(LOG, rpu=[1, 6, 25][seed % 3])
    admitted = replay(LocalLimiter(), r, list(random_trace(seed, 800, mean_gap_ms=40)))
    assert worst_trailing_count(admitted, 1000) <= [1, 6, 25][seed % 3]


@pytest.mark.parametrize(
    "trace",
    [list(boundary_bursts(40, 1000, windows=4)), list(span_end_bursts(40, 1000, 4, count=3))],
    ids=["window-boundaries", "span-ends"],
)
def test_no_trailing_window_ever_holds_more_than_max(trace: list[tuple[int, int]]) -> None:
    admitted = replay(LocalLimiter(), trailing_rule(LOG, rpu=40), trace)
    assert worst_trailing_count(admitted, 1000) == 40


def probe(r: Rule, sent: list[tuple[int, int]], now: int, hits: int) -> Code:
    """The answer to `hits` at `now` after the requests `sent`, from a limiter of its own."""
    limiter = LocalLimiter()
    for then, then_hits in sent:
        limiter.hit(then, [hit(r, hits=then_hits)])
    return limiter.hit(now, [hit(r, hits=hits)]).code


def test_retry_after_is_the_first_moment_the_request_fits() -> None:
    r = trailing_rule(LOG, rpu=9)
    limiter, sent, checked = LocalLimiter(), [], 0
    for now, hits in random_trace(7, 400, mean_gap_ms=30):
        verdict = limiter.hit(now, [hit(r, hits=hits)]).verdicts[0]
        sent.append((now, hits))
        if verdict.code is Code.OK or checked > 40:
            continue
        checked += 1
        retry = now + verdict.reset_ms
        assert verdict.reset_ms > 0
        assert probe(r, sent, retry - 1, hits) is Code.OVER_LIMIT
        assert probe(r, sent, retry, hits) is Code.OK
    assert checked > 10


def test_hits_of_one_millisecond_share_an_entry_and_entries_never_outnumber_max() -> None:
    r, shadow = trailing_rule(LOG, rpu=5), trailing_rule(LOG, rpu=5, shadow=True, key="s")
    limiter = LocalLimiter()
    for _ in range(5):
        limiter.hit(T0 + 7, [hit(r)])
    for i in range(20):  # a shadow rule counts past MAX
        assert limiter.hit(T0 + i, [hit(shadow)]).code is Code.OK
    logs = [limiter.keys.get(hit(rl).key) for rl in (r, shadow)]
    assert [len(s.hit_log().times) for s in logs if s] == [1, 5]
    assert [s.hit_log().total for s in logs if s] == [5, 20]
    merged = logs[1].hit_log() if logs[1] else None
    assert merged is not None  # the oldest merged into the next: over-counted, in order
    assert (list(merged.times), list(merged.counts)) == (
        [T0 + 15, *range(T0 + 16, T0 + 20)],
        [16, 1, 1, 1, 1],
    )


def test_a_cooldown_blocks_and_retry_after_is_the_blocks_end() -> None:
    r = trailing_rule(LOG, rpu=2, cooldown_ms=3000)
    limiter = LocalLimiter()
    assert [limiter.hit(T0 + i, [hit(r)]).code for i in range(2)] == [Code.OK] * 2
    assert limiter.hit(T0 + 5, [hit(r)]).verdicts[0].reset_ms == 3000
    assert limiter.hit(T0 + 3004, [hit(r)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 3005, [hit(r)]).code is Code.OK


def test_shadow_rules_answer_ok_marked_shadowed_and_near_limit_from_80_percent() -> None:
    r = trailing_rule(LOG, rpu=5, shadow=True)
    limiter = LocalLimiter()
    verdicts = [limiter.hit(T0 + i, [hit(r)]).verdicts[0] for i in range(6)]
    assert all(v.code is Code.OK for v in verdicts)
    assert [v.shadow_refused for v in verdicts] == [False] * 5 + [True]
    assert [v.near_limit for v in verdicts[:5]] == [False, False, False, True, True]


def test_more_hits_than_max_never_fit_and_quota_can_be_given_back() -> None:
    r = trailing_rule(LOG, rpu=4)
    limiter = LocalLimiter()
    assert limiter.hit(T0, [hit(r, hits=5)]).verdicts[0].reset_ms == 1000
    assert limiter.hit(T0, [hit(r, hits=3)]).code is Code.OK
    limiter.hit(T0 + 100, [hit(r, hits=1)])
    limiter.hit(T0 + 200, [hit(r, hits=-2)])  # the newest hit and one of the first three
    verdict = limiter.hit(T0 + 300, [hit(r, hits=2)]).verdicts[0]
    assert (verdict.remaining, verdict.reset_ms) == (0, 700)


def test_a_key_is_forgotten_only_once_its_window_is_empty() -> None:
    r = trailing_rule(LOG, rpu=3, unit=Unit.HOUR)
    limiter = LocalLimiter()
    limiter.hit(T0, [hit(r, hits=3)])
    limiter.sweep(T0 + IDLE_MS)  # an hour's window: kept for two windows
    assert limiter.hit(T0 + IDLE_MS + 1, [hit(r)]).code is Code.OVER_LIMIT
    limiter.sweep(T0 + 2 * 3_600_000 + 1)
    assert len(limiter.keys) == 0


def test_an_evicted_key_resumes_its_count() -> None:
    r = trailing_rule(LOG, rpu=10, unit=Unit.MINUTE)
    limiter = LocalLimiter(max_keys=1)
    for i in range(8):
        limiter.hit(T0 + i, [hit(r, "heavy")])
    limiter.hit(T0 + 40_000, [hit(r, "other")])  # evicts "heavy"
    codes = [limiter.hit(T0 + 50_000 + i, [hit(r, "heavy")]).code for i in range(3)]
    assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT]


def test_a_rule_reloaded_with_another_algorithm_starts_a_fresh_counter() -> None:
    log = trailing_rule(LOG, rpu=2)
    limiter = LocalLimiter()
    assert [limiter.hit(T0, [hit(log)]).code for _ in range(3)][-1] is Code.OVER_LIMIT
    as_window = trailing_rule(WINDOW, rpu=2)
    assert limiter.hit(T0 + 1, [hit(as_window, hits=2)]).code is Code.OK
    back = trailing_rule(LOG, rpu=2)  # another reload: a log again, fresh again
    assert limiter.hit(T0 + 2, [hit(back, hits=2)]).code is Code.OK
    assert limiter.hit(T0 + 3, [hit(trailing_rule(LOG, rpu=2))]).code is Code.OVER_LIMIT


def test_several_limits_mix_a_log_and_a_fixed_window() -> None:
    burst = RateLimit(2, Unit.SECOND, algorithm=LOG)
    hourly = RateLimit(3, Unit.HOUR, cooldown_ms=1)
    r = Rule("d", (("k", ""),), limits=(burst, hourly))
    limiter = LocalLimiter()
    decisions = [limiter.hit(T0 + t, [hit(r)]) for t in (0, 1, 2, 1001, 1002)]
    ok, over = Code.OK, Code.OVER_LIMIT
    assert [d.code for d in decisions] == [ok, ok, over, ok, over]
    assert decisions[2].verdicts[0].limit is burst
    assert decisions[2].verdicts[0].reset_ms == 998  # the first hit leaves at 1000
    assert decisions[4].verdicts[0].limit is hourly


def test_fixed_windows_are_untouched() -> None:
    limiter = LocalLimiter()
    r = rule(rpu=2)
    assert [limiter.hit(T0 + 999, [hit(r)]).code for _ in range(3)][-1] is Code.OVER_LIMIT
    state = limiter.keys.get(hit(r).key)
    assert state is not None and isinstance(state.counts, WindowCounts)  # no log, no spans
