"""The token bucket rule (core/token_bucket.py) on a fake clock: alone, exactly the textbook
bucket of simulate/exact/token_bucket.py; in a fleet, the store's debt plus own hits, each
standing for `nodes`."""

from __future__ import annotations

import math
import random

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    Hit,
    Limiter,
    LocalLimiter,
    PushResult,
    SyncBatch,
    SyncResult,
    Verdict,
)
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.local import IDLE_MS
from ratelimit_sidecar.core.spans import span_end
from ratelimit_sidecar.core.token_bucket import TokenBucket
from simulator.exact.token_bucket import Answer, Bucket, TokenBuckets, decide
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
Trace = list[tuple[int, str, int]]  # (time ms, key value, hits)


def bucket_limit(
    rpu: int = 10, burst: int = 0, unit: Unit = Unit.SECOND, cooldown_ms: int = 0, spans: int = 2
) -> RateLimit:
    bucket = AlgorithmName.TOKEN_BUCKET
    return RateLimit(rpu, unit, spans=spans, cooldown_ms=cooldown_ms, algorithm=bucket, burst=burst)


def bucket_rule(
    rpu: int = 10,
    burst: int = 0,
    unit: Unit = Unit.SECOND,
    *,
    cooldown_ms: int = 0,
    shadow: bool = False,
    spans: int = 2,
) -> Rule:
    limit = bucket_limit(rpu, burst, unit, cooldown_ms, spans)
    return Rule("d", (("k", ""),), limit, shadow_mode=shadow)


def one(limiter: Limiter, now: int, h: Hit) -> Verdict:
    return limiter.hit(now, [h]).verdicts[0]


def state_of(limiter: Limiter, h: Hit) -> KeyState:
    state = limiter.keys.get(h.key)
    assert state is not None
    return state


def as_answer(verdict: Verdict) -> Answer:
    if verdict.code is Code.OK:
        return Answer(True, verdict.remaining, verdict.reset_ms)
    return Answer(False, 0, verdict.reset_ms)


# -- traces ---------------------------------------------------------------------------------


def random_trace(rng: random.Random, limit: RateLimit, length: int) -> Trace:
    """Hits near the bucket's rate, on three keys, with bursts, odd sizes and long silences."""
    interval = limit.window_ms / limit.requests_per_unit
    now, trace = T0 + rng.randrange(1000), []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.02:
            now += rng.randrange(IDLE_MS, 3 * IDLE_MS)  # the sweep may forget a key meanwhile
        elif roll < 0.3:
            now += rng.randrange(3)  # a burst: same or next ms
        else:
            now += int(rng.expovariate(1.2 / interval))
        size = rng.choice([1, 1, 1, 1, 2, 3, 0, -1, limit.capacity, limit.capacity + 1])
        trace.append((now, rng.choice("abc"), size))
    return trace


def run_alone(limit: RateLimit, trace: Trace, sweep: bool = True) -> list[Answer]:
    """The limiter alone (local-only mode) on `trace`, sweeping as the server does."""
    limiter, r = LocalLimiter(), Rule("d", (("k", ""),), limit)
    answers, last_sweep = [], trace[0][0]
    for now, value, hits in trace:
        if sweep and now - last_sweep >= IDLE_MS // 4:
            limiter.sweep(now)
            last_sweep = now
        answers.append(as_answer(one(limiter, now, hit(r, value, hits))))
    return answers


def run_exact(limit: RateLimit, trace: Trace) -> list[Answer]:
    buckets = TokenBuckets(limit)
    return [buckets.take(("d", "k", value), now, hits) for now, value, hits in trace]


LIMITS = [
    bucket_limit(10),  # capacity = requests_per_unit
    bucket_limit(3, burst=7),  # burst > rpu; T = 333.3... ms, not a whole ms
    bucket_limit(7, burst=2, unit=Unit.MINUTE),  # burst < rpu
    bucket_limit(100, burst=250),
    bucket_limit(10, burst=1000),  # a debt outlasting IDLE_MS: the sweep must keep the key
    bucket_limit(1),
]


@pytest.mark.parametrize("limit", LIMITS, ids=lambda lim: f"{lim.requests_per_unit}-{lim.burst}")
@pytest.mark.parametrize("seed", range(4))
def test_alone_every_answer_is_the_exact_buckets(limit: RateLimit, seed: int) -> None:
    trace = random_trace(random.Random(seed), limit, 600)
    assert run_alone(limit, trace) == run_exact(limit, trace)


@pytest.mark.parametrize("limit", LIMITS[:4], ids=lambda lim: f"{lim.requests_per_unit}")
def test_alone_bursts_then_silence_match_the_exact_bucket(limit: RateLimit) -> None:
    rng, trace = random.Random(7), []
    now = T0
    for _ in range(40):  # bursts of up to twice the capacity, then a random pause
        burst = rng.randrange(2 * limit.capacity)
        trace += [(now + i // 3, "a", 1) for i in range(burst)]
        now += burst // 3 + rng.randrange(limit.window_ms * 2)
    answers = run_alone(limit, trace)
    assert answers == run_exact(limit, trace)
    assert {a.admitted for a in answers} == {True, False}  # the trace tests both sides


def test_retry_after_is_the_truth() -> None:
    """Retried at now + reset_ms, a refused request is admitted; a ms earlier it is not."""
    limit = bucket_limit(3, burst=5)
    trace = [(t, "a", n) for t, n in decide_log_of(random.Random(3), 200)]
    answers = run_alone(limit, trace, sweep=False)
    refusals = [i for i, a in enumerate(answers) if not a.admitted and trace[i][2] <= 5]
    assert len(refusals) >= 10
    for i in refusals[:25]:
        now, _, hits = trace[i]
        wait = answers[i].reset_ms
        assert wait > 0
        early = run_alone(limit, [*trace[:i], (now + wait - 1, "a", hits)], sweep=False)[-1]
        on_time = run_alone(limit, [*trace[:i], (now + wait, "a", hits)], sweep=False)[-1]
        assert (early.admitted, on_time.admitted) == (False, True)


def decide_log_of(rng: random.Random, length: int) -> list[tuple[int, int]]:
    now, log = T0, []
    for _ in range(length):
        now += rng.randrange(0, 400)
        log.append((now, rng.choice([1, 1, 2, 3])))
    return log


def test_the_exact_reference_on_a_hand_computed_log() -> None:
    """3 tokens a second (one per 333.3 ms), capacity 2."""
    limit = bucket_limit(3, burst=2)
    log = [(0, 1), (0, 1), (0, 1), (300, 1), (334, 1), (1000, 3), (1000, 2)]
    assert decide(limit, log) == [
        Answer(True, 1, 334),
        Answer(True, 0, 667),
        Answer(False, 0, 334),  # one token at 333.3 ms
        Answer(False, 0, 34),
        Answer(True, 0, 666),  # 334 ms refilled 1.002 tokens
        Answer(False, 0, 0),  # more than the capacity: told when the bucket is full
        Answer(True, 0, 667),
    ]
    bucket = Bucket.of(limit)
    assert bucket.take(5, -1) == Answer(True, 2, 0)  # a full bucket takes no more back


# -- capacity, remaining, reset -------------------------------------------------------------


def test_burst_over_rpu_admits_the_burst_then_the_rate() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=20)
    verdicts = [one(limiter, T0, hit(r)) for _ in range(21)]
    assert [v.code for v in verdicts].count(Code.OK) == 20
    assert verdicts[19].remaining == 0 and verdicts[19].reset_ms == 2000  # 20 tokens to refill
    assert verdicts[20].reset_ms == 100  # one token: 100 ms
    assert one(limiter, T0 + 99, hit(r)).code is Code.OVER_LIMIT
    assert one(limiter, T0 + 100, hit(r)).code is Code.OK


def test_burst_under_rpu_smooths_the_rate() -> None:
    """10 a second with a burst of 2: no more than 2 at once, 10 over a second."""
    limiter, r = LocalLimiter(), bucket_rule(10, burst=2)
    codes = [one(limiter, T0, hit(r)).code for _ in range(3)]
    assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT]
    admitted = sum(one(limiter, T0 + ms, hit(r)).code is Code.OK for ms in range(1, 1002, 10))
    assert admitted == 10


def test_remaining_counts_whole_tokens_and_reset_is_until_full() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=10)
    v = one(limiter, T0, hit(r, hits=3))
    assert (v.code, v.remaining, v.reset_ms, v.limit) == (Code.OK, 7, 300, r.limit)
    v = one(limiter, T0 + 150, hit(r, hits=0))  # 1.5 tokens back: 8.5 left
    assert (v.remaining, v.reset_ms, v.near_limit) == (8, 150, False)
    v = one(limiter, T0 + 150, hit(r, hits=7))
    assert (v.remaining, v.reset_ms, v.near_limit) == (1, 850, True)


def test_more_hits_than_the_capacity_never_fit() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=5)
    one(limiter, T0, hit(r, hits=2))
    v = one(limiter, T0, hit(r, hits=6))
    assert (v.code, v.reset_ms) == (Code.OVER_LIMIT, 200)  # until full: the best there is


def test_a_cooldown_blocks_only_when_set() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=2, cooldown_ms=500)
    codes = [one(limiter, T0, hit(r)).code for _ in range(3)]
    assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT]
    v = one(limiter, T0 + 499, hit(r))
    assert (v.code, v.reset_ms) == (Code.OVER_LIMIT, 1)  # the block's end, not the refill's
    assert one(limiter, T0 + 500, hit(r)).code is Code.OK


def test_a_shadow_bucket_counts_refused_hits_no_deeper_than_an_enforced_one() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=2, shadow=True)
    verdicts = [one(limiter, T0, hit(r)) for _ in range(5)]
    assert all(v.code is Code.OK for v in verdicts)
    assert [v.shadow_refused for v in verdicts] == [False, False, True, True, True]
    assert not one(limiter, T0 + 100, hit(r)).shadow_refused  # one token back, as if enforced


def test_tokens_given_back() -> None:
    limiter, r = LocalLimiter(), bucket_rule(10, burst=5)
    one(limiter, T0, hit(r, hits=5))
    assert one(limiter, T0, hit(r, hits=-2)).remaining == 2
    assert one(limiter, T0, hit(r, hits=-9)).remaining == 5  # never over the capacity
    assert state_of(limiter, hit(r)).pending == 5 - 2 - 3  # the push gives back what was taken


# -- a key's life: idle, eviction, reload, several limits ---------------------------------------


def test_a_key_in_debt_is_not_forgotten() -> None:
    """A debt of 100 s outlives IDLE_MS (60 s) and two windows: forgetting the key then would
    hand out a full bucket."""
    limiter, r = LocalLimiter(), bucket_rule(10, burst=1000)
    assert one(limiter, T0, hit(r, hits=1000)).code is Code.OK
    limiter.sweep(T0 + IDLE_MS + 1000)
    assert one(limiter, T0 + IDLE_MS + 1000, hit(r, hits=0)).remaining == 610
    limiter.sweep(T0 + 100_000)
    assert len(limiter.keys) == 0
    state = KeyState(("d", "k", "v"), r, bucket_limit(10, burst=1000), T0, 1)
    TokenBucket().start(state, 0)
    TokenBucket().count(state, 1000, T0)
    state.pending = 0  # pushed
    assert not state.idle(T0 + 99_999)
    assert state.idle(T0 + 100_000)


def test_a_key_in_debt_is_kept_by_a_fleet_too() -> None:
    limiter, r = FleetLimiter(), bucket_rule(10, burst=1000)
    limiter.hit(T0, [hit(r, hits=1000)])
    for now in range(T0 + 500, T0 + 100_501, 500):
        batch = limiter.end_span(now)
        debt = max(0, T0 + 100_000 - now)
        pushes = tuple(PushResult(debt, 0) for _ in batch.pushes)
        limiter.apply_sync(now, batch, SyncResult(pushes, (1000,) * len(batch.total_reads)))
        assert (len(limiter.keys) == 1) == (now < T0 + 100_000)


def test_an_evicted_bucket_comes_back_with_its_debt() -> None:
    limiter, r = LocalLimiter(max_keys=1), bucket_rule(60, burst=10, unit=Unit.MINUTE)
    for _ in range(10):
        one(limiter, T0, hit(r, "a"))
    one(limiter, T0 + 1, hit(r, "b"))  # evicts a
    assert limiter.keys.get(hit(r, "a").key) is None
    v = one(limiter, T0 + 2, hit(r, "a"))  # evicts b; a resumes its 10 tokens of debt
    assert v.code is Code.OVER_LIMIT
    assert 998 <= v.reset_ms <= 1000  # the refill while it was out is not credited


def test_a_reload_that_changes_the_algorithm_starts_a_fresh_counter() -> None:
    limiter = LocalLimiter()
    fixed = rule(rpu=5)
    assert [one(limiter, T0, hit(fixed)).code for _ in range(6)].count(Code.OK) == 5
    bucket = bucket_rule(5)  # the same descriptor, now a token bucket
    assert [one(limiter, T0 + 1, hit(bucket)).code for _ in range(6)].count(Code.OK) == 5
    same = bucket_rule(5)  # reloaded unchanged: the counter stays
    assert one(limiter, T0 + 2, hit(same)).code is Code.OVER_LIMIT
    bigger = bucket_rule(5, burst=8)  # a new burst: a new bucket
    assert [one(limiter, T0 + 3, hit(bigger)).code for _ in range(9)].count(Code.OK) == 8


def test_a_bucket_and_a_daily_quota_on_one_descriptor() -> None:
    """rate_limits: bursts of 10 at 10/s, and 25 a day."""
    daily = RateLimit(25, Unit.DAY, spans=2)
    r = Rule("d", (("k", ""),), limits=(bucket_limit(10), daily))
    limiter = LocalLimiter()
    v = one(limiter, T0, hit(r, hits=3))
    assert (v.limit, v.remaining) == (r.limits[0], 7)  # the fewest remaining answers
    codes = [one(limiter, T0, hit(r)).code for _ in range(8)]
    assert codes.count(Code.OK) == 7
    refused = one(limiter, T0 + 1, hit(r))
    assert (refused.code, refused.limit, refused.reset_ms) == (Code.OVER_LIMIT, r.limits[0], 99)
    assert [one(limiter, T0 + 1000, hit(r)).code for _ in range(11)].count(Code.OK) == 10
    codes = [one(limiter, T0 + 2000, hit(r)).code for _ in range(10)]
    assert codes.count(Code.OK) == 5  # the day's 25
    refused = one(limiter, T0 + 3000, hit(r))
    assert refused.limit is daily and refused.reset_ms > 3_600_000


# -- a fleet ----------------------------------------------------------------------------------


def fleet(nodes: int) -> FleetLimiter:
    limiter = FleetLimiter()
    limiter.live_nodes = nodes  # what the store's heartbeats said
    return limiter


def test_own_hits_at_once_stand_for_every_node() -> None:
    """4 nodes, capacity 10 (T = 100 ms). A key new to the node starts full: its first hit
    takes one token; each hit after it at once projects 4."""
    limiter, r = fleet(4), bucket_rule(10)
    verdicts = [one(limiter, T0, hit(r)) for _ in range(4)]
    assert [v.remaining for v in verdicts[:3]] == [9, 5, 1]
    assert (verdicts[3].code, verdicts[3].reset_ms) == (Code.OVER_LIMIT, 300)


def test_others_are_spread_over_time_so_a_small_bucket_works_on_many_nodes() -> None:
    """Capacity 1 on 4 nodes: own hits 4 T apart fit, as the fleet's bucket would take them
    (others add 3 T between two own hits, and the refill takes 4 T back)."""
    limiter, r = fleet(4), bucket_rule(10, burst=1)
    codes = [one(limiter, T0 + 400 * i, hit(r)).code for i in range(10)]
    assert codes == [Code.OK] * 10
    v = one(limiter, T0 + 3999, hit(r))
    assert (v.code, v.reset_ms) == (Code.OVER_LIMIT, 1)


def test_only_refusals_on_the_guess_count_as_offered_for_the_nodes_estimate() -> None:
    """A bucket known to be empty refuses every node alike: that does not skew `nodes`."""
    limiter, r = fleet(4), bucket_rule(10)
    assert [one(limiter, T0, hit(r)).code for _ in range(4)].count(Code.OK) == 3
    assert state_of(limiter, hit(r)).nodes.refused == 1  # own debt 3 tokens: the guess refused it
    batch = limiter.end_span(T0 + 500)
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(1000, 0),)))
    assert one(limiter, T0 + 500, hit(r)).code is Code.OVER_LIMIT
    assert state_of(limiter, hit(r)).nodes.refused == 1  # the store's debt refused it


def test_the_stores_debt_replaces_the_estimate() -> None:
    limiter, r = fleet(4), bucket_rule(10)
    one(limiter, T0, hit(r))
    batch = limiter.end_span(T0 + 500)
    assert [(p.window, p.hits) for p in batch.pushes] == [(T0 // 1000, 1)]  # own hits only
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(650, 0),)))
    v = one(limiter, T0 + 500, hit(r, hits=0))
    assert (v.remaining, v.reset_ms) == (3, 650)  # 6.5 tokens of debt
    v = one(limiter, T0 + 500, hit(r))
    assert (v.code, v.reset_ms) == (Code.OVER_LIMIT, 50)  # 6.5 + 4 > 10: 0.5 token short
    assert one(limiter, T0 + 550, hit(r)).code is Code.OK


def test_hits_counted_while_the_push_is_in_flight_join_the_stores_debt() -> None:
    limiter, r = fleet(1), bucket_rule(10)
    one(limiter, T0 + 100, hit(r))
    batch = limiter.end_span(T0 + 500)
    one(limiter, T0 + 500, hit(r, hits=2))  # after the push left
    limiter.apply_sync(T0 + 502, batch, SyncResult((PushResult(300, 0),)))
    v = one(limiter, T0 + 502, hit(r, hits=0))
    assert (v.remaining, v.reset_ms) == (5, 500)  # 3 tokens of the store + 2 own


def test_a_store_debt_over_the_capacity_blocks_only_with_a_cooldown() -> None:
    for cooldown, blocked in ((0, 0), (2000, 1)):
        limiter, r = fleet(2), bucket_rule(10, cooldown_ms=cooldown)
        one(limiter, T0, hit(r))
        batch = limiter.end_span(T0 + 500)
        stats = limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(1200, 0),)))
        assert stats.blocked_keys == blocked
        v = one(limiter, T0 + 500, hit(r))
        assert (v.code, v.reset_ms) == (Code.OVER_LIMIT, cooldown or 400)


def test_store_failure_keeps_counting_own_hits_for_every_node() -> None:
    limiter, r = fleet(4), bucket_rule(10, spans=4)
    one(limiter, T0, hit(r))
    batch = limiter.end_span(T0 + 250)
    stats = limiter.apply_sync(T0 + 250, batch, None)
    assert stats.failed and stats.blocked_keys == 0 and stats.dropped_hits == 0
    # the estimate goes on: debts of 2.5, then 6.5, then 10.5 tokens
    assert [one(limiter, T0 + 250, hit(r)).code for _ in range(3)].count(Code.OK) == 2
    batch = limiter.end_span(T0 + 500)  # the store is back: the failed span goes out again
    assert [(p.window, p.hits) for p in batch.pushes] == [(T0 // 1000, 1), (T0 // 1000, 2)]
    limiter.apply_sync(T0 + 500, batch, SyncResult((PushResult(200, 0), PushResult(300, 0))))
    assert one(limiter, T0 + 500, hit(r, hits=0)).remaining == 7
    assert limiter.pending_hits() == 0


def test_nodes_are_learnt_from_the_window_counter() -> None:
    limiter, r = fleet(1), bucket_rule(1000)
    for _ in range(10):
        one(limiter, T0, hit(r))
    for now, total in ((T0 + 500, ()), (T0 + 1000, ()), (T0 + 1500, (40,))):
        batch = limiter.end_span(now)
        assert len(batch.total_reads) == len(total)
        limiter.apply_sync(now, batch, SyncResult((PushResult(0, 0),), totals=total))
    assert state_of(limiter, hit(r)).nodes.value == 4.0


class BucketStore:
    """The store's side of the contract (common to every store): TAT = max(TAT, now) + count x T,
    answered as the debt in whole ms; window counters for the nodes estimate."""

    def __init__(self) -> None:
        self.tat: dict[tuple[str, ...], float] = {}
        self.windows: dict[tuple[tuple[str, ...], int], int] = {}

    def execute(self, batch: SyncBatch, now: int) -> SyncResult:
        answers = []
        for push in batch.pushes:
            interval = push.limit.window_ms / push.limit.requests_per_unit
            moved = max(self.tat.get(push.key, 0.0), now) + push.hits * interval
            self.tat[push.key] = max(moved, now)
            counter = (push.key, push.window)
            self.windows[counter] = self.windows.get(counter, 0) + push.hits
            answers.append(PushResult(math.ceil(self.tat[push.key] - now), 0))
        totals = tuple(self.windows.get((read.key, read.window), 0) for read in batch.total_reads)
        return SyncResult(tuple(answers), totals)


def run_fleet(limit: RateLimit, nodes: int, arrivals: list[tuple[int, int]]) -> list[int]:
    """When `nodes` limiters sharing a BucketStore, synced at every span end, admit a hit."""
    r, store = Rule("d", (("k", ""),), limit), BucketStore()
    fleet = [FleetLimiter() for _ in range(nodes)]
    admitted, next_sync = [], span_end(arrivals[0][0], limit.window_ms, limit.spans)
    for now, node in arrivals:
        while next_sync <= now:
            for limiter in fleet:
                batch = limiter.end_span(next_sync)
                limiter.apply_sync(next_sync, batch, store.execute(batch, next_sync))
            next_sync = span_end(next_sync, limit.window_ms, limit.spans)
        if fleet[node].hit(now, [hit(r)]).code is Code.OK:
            admitted.append(now)
    return admitted


FLEET_CASES = [  # burst, load (x 100/s), spans, most admitted that one exact bucket refuses
    (100, 0.9, 6, 0.0),
    (100, 2.0, 6, 0.01),
    (30, 4.0, 6, 0.08),  # 25 % if the nodes never learn they are 4
    (10, 2.0, 20, 0.015),  # 3.6 % if the nodes never learn they are 4
]


@pytest.mark.parametrize(("burst", "load", "spans", "most_over"), FLEET_CASES)
def test_a_fleet_admits_about_what_one_exact_bucket_would(
    burst: int, load: float, spans: int, most_over: float
) -> None:
    """4 nodes share 100/s through the store, Poisson traffic spread over them; the nodes
    learn that they are 4 from the window counters. As many are admitted as by one exact
    bucket, and few that one exact bucket, fed what the fleet admitted, would refuse: the
    fleet's bursts (its total alone cannot tell: the store's debt evens it out)."""
    limit, rng = bucket_limit(100, burst=burst, spans=spans), random.Random(5)
    now, arrivals = float(T0), []
    while now < T0 + 20_000:
        now += rng.expovariate(load * 100 / 1000)
        arrivals.append((int(now), rng.randrange(4)))
    exact = sum(answer.admitted for answer in decide(limit, [(t, 1) for t, _ in arrivals]))
    admitted = run_fleet(limit, 4, arrivals)
    assert 0.98 * exact <= len(admitted) <= 1.01 * exact
    over = sum(not answer.admitted for answer in decide(limit, [(t, 1) for t in admitted]))
    assert over <= most_over * len(admitted)
