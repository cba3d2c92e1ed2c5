"""Envoy 1.40's side of RLQS as the simulator models it, and the RLQS plumbing of the engine.

The engine tests use a stand-in server that always hands out one fixed assignment: they check
what Envoy and the engine do with answers (reports, outages, first reports), not the rule that
computes them (that rule's own tests live with it in the core).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ratelimit_sidecar.core import Hit, Limiter
from ratelimit_sidecar.core.quota_assign import Action
from simulator.engine import KEY, Engine
from simulator.envoy_quota import (
    REPORT_PERIOD_MS,
    EnvoyAssignment,
    EnvoyBucket,
    Usage,
)
from simulator.params import SimParams
from simulator.rlqs import RlqsPlan
from simulator.scenarios import resolve
from simulator.variants import system_for

HOUR_MS = 3_600_000


def bucket(
    max_tokens: int, per_fill: int, interval_ms: int, ttl_ms: int = HOUR_MS
) -> EnvoyAssignment:
    return EnvoyAssignment(Action.TOKEN_BUCKET, ttl_ms, max_tokens, per_fill, interval_ms)


def admitted(envoy: EnvoyBucket, times: range) -> int:
    return sum(envoy.admit(t) for t in times)


def test_a_token_bucket_starts_full_and_refills_at_its_rate() -> None:
    envoy = EnvoyBucket()
    envoy.assign(0, bucket(10, 5, 1000))
    assert admitted(envoy, range(0, 100)) == 10  # full, then empty within 100 ms
    assert admitted(envoy, range(1000, 1100)) == 5  # one fill interval later: 5 more
    assert admitted(envoy, range(10_000, 10_100)) == 10  # never more than max_tokens


def test_envoy_1_40_quirks_of_the_token_bucket() -> None:
    never_refills = EnvoyBucket()
    never_refills.assign(0, bucket(3, 0, 1000))
    assert admitted(never_refills, range(0, 60_000, 100)) == 3
    sub_second = EnvoyBucket()
    sub_second.assign(0, bucket(1, 1, 500))
    assert admitted(sub_second, range(0, 1000, 10)) == 100  # unlimited


def test_other_numbers_keep_the_fill_level_the_same_numbers_keep_the_tokens() -> None:
    """As 1.40 measured (docs/RLQS-ENVOY.md): 5 of 10 left, then max 20: 10; a full 10, then
    max 3: 3; 2 of 10, then 12: 2. No refill in between (one token per hour)."""
    for left, new_max, expected in ((5, 20, 10), (10, 3, 3), (2, 12, 2)):
        envoy = EnvoyBucket()
        envoy.assign(0, bucket(10, 1, HOUR_MS))
        assert admitted(envoy, range(10 - left)) == 10 - left
        envoy.assign(100, bucket(new_max, 1, HOUR_MS))
        assert admitted(envoy, range(100, 200)) == expected
    same = EnvoyBucket()
    same.assign(0, bucket(4, 1, HOUR_MS))
    assert admitted(same, range(4)) == 4
    same.assign(10, bucket(4, 1, HOUR_MS, ttl_ms=60_000))  # tokens kept, TTL renewed
    assert admitted(same, range(10, 20)) == 0
    assert same.expires_at == 60_010


def test_a_bucket_after_deny_all_or_expiry_starts_full() -> None:
    envoy = EnvoyBucket()
    envoy.assign(0, bucket(4, 1, HOUR_MS, ttl_ms=1000))
    assert admitted(envoy, range(4)) == 4
    envoy.assign(2000, bucket(5, 1, HOUR_MS))  # the last one expired
    assert admitted(envoy, range(2000, 2010)) == 5
    envoy.assign(3000, EnvoyAssignment(Action.DENY_ALL, ttl_ms=1000))
    envoy.assign(3500, bucket(6, 1, HOUR_MS))
    assert admitted(envoy, range(3500, 3510)) == 6
    assert envoy.rebuilds == 3


def test_deny_all_holds_for_its_ttl_then_the_fallback_applies() -> None:
    envoy = EnvoyBucket()
    envoy.assign(0, EnvoyAssignment(Action.DENY_ALL, ttl_ms=2000))
    assert admitted(envoy, range(0, 2000, 100)) == 0
    assert admitted(envoy, range(2000, 3000, 100)) == 10  # expired: ALLOW_ALL fallback
    no_ttl = EnvoyBucket()
    no_ttl.assign(0, EnvoyAssignment(Action.DENY_ALL))  # 1.40: unset TTL expires at once
    assert admitted(no_ttl, range(0, 1000, 100)) == 10


def test_usage_is_counted_between_reports_and_lost_when_not_sent() -> None:
    envoy = EnvoyBucket()
    envoy.assign(0, bucket(2, 1, 1000))
    admitted(envoy, range(0, 5))
    assert envoy.take_usage(0) == Usage(2, 3, 0)  # the first report: time_elapsed 0
    admitted(envoy, range(5, 10))
    envoy.drop_usage(5_700)
    assert envoy.lost == 0  # nothing allowed since: the bucket was empty
    envoy.assign(6000, bucket(9, 1, 1000))
    admitted(envoy, range(6000, 6004))
    assert envoy.take_usage(11_900) == Usage(4, 0, 6000)  # whole seconds since 5.7 s
    admitted(envoy, range(12_000, 12_003))
    envoy.drop_usage(13_000)
    assert envoy.lost == 3


def test_an_abandoned_bucket_drops_its_unreported_usage_and_is_made_anew() -> None:
    """What a bucket admitted since its last report is never sent once it is abandoned; the next
    request is admitted by the no-assignment fallback and reported at once, alone."""
    envoy = EnvoyBucket()
    envoy.assign(0, bucket(5, 1, 1000))
    admitted(envoy, range(0, 3))
    envoy.assign(10, EnvoyAssignment(Action.ABANDON))
    assert envoy.new and envoy.assignment is None
    assert envoy.admit(20)  # ALLOW_ALL: no assignment yet
    assert envoy.take_usage(20) == Usage(1, 0, 0)


class FixedServer:
    """A stand-in RLQS server: counts the usage as the limiter's hits, answers `answer`."""

    recheck_ms = 0

    def __init__(self, answer: EnvoyAssignment) -> None:
        self.answer = answer
        self.reports: list[tuple[int, Usage]] = []

    def recheck(self, limiter: Limiter, hits: Sequence[Hit], now_ms: int) -> None:
        raise AssertionError("a fixed answer is never rechecked")

    def report(
        self, limiter: Limiter, hits: Sequence[Hit], now_ms: int, usage: Usage
    ) -> EnvoyAssignment | None:
        self.reports.append((now_ms, usage))
        if usage.allowed:
            limiter.hit(now_ms, [Hit(hits[0].rule, hits[0].key, usage.allowed)])
        return self.answer


def run_rlqs(system: str, answer: EnvoyAssignment, **params: object) -> tuple[Engine, FixedServer]:
    setup = resolve(SimParams(**params))  # type: ignore[arg-type]
    server = FixedServer(answer)
    engine = Engine(setup, system_for(system), lambda: server)
    engine.run()
    return engine, server


def test_rlqs_gateways_report_every_5_s_and_a_new_bucket_at_once() -> None:
    engine, server = run_rlqs(
        "rlqs", EnvoyAssignment(Action.ALLOW_ALL, HOUR_MS), nodes=1, windows=6
    )
    start = engine.setup.start_ms
    times = [t for t, _ in server.reports]
    assert times[0] - start < 50  # the first request's own report, at once
    gaps = {b - a for a, b in itertools.pairwise(times[1:])}
    assert gaps == {REPORT_PERIOD_MS}
    gateway = engine.nodes[0].gateway
    assert gateway is not None
    envoy = gateway.envoy
    assert envoy is not None  # every admitted request is reported, but the last 5 s' ones
    reported = sum(u.allowed for _, u in server.reports)
    assert reported + envoy.allowed == sum(engine.recorder.admitted)


def test_a_token_bucket_assignment_bounds_each_gateway() -> None:
    # 2 gateways, each given 10 tokens refilled at 2/s: at most 10 + 2 x 10 = 30 per 10 s window
    engine, _ = run_rlqs("rlqs", bucket(10, 2, 1000), nodes=2, windows=12, max=240)
    assert max(engine.recorder.admitted[1:]) <= 2 * (2 * 10 + 10)
    assert min(engine.recorder.admitted[2:]) >= 2 * 2 * 10 - 2


def test_half_the_gateways_on_rlqs_and_usage_lost_in_an_rlqs_outage() -> None:
    allow = EnvoyAssignment(Action.ALLOW_ALL, ttl_ms=20_000)
    engine, server = run_rlqs("rlqs-half", allow, nodes=4, windows=12, scenario="rlqs_outage")
    on_rlqs = sorted(i for i, n in engine.nodes.items() if n.gateway is not None)
    assert on_rlqs == [1, 3]
    a, b = engine.setup.rlqs_outages[0]
    assert not any(a <= t < b for t, _ in server.reports)
    assert engine.rlqs_stats.lost_reports >= 2 * ((b - a) // REPORT_PERIOD_MS) - 2
    assert engine.rlqs_stats.lost_hits > 0
    assert engine.recorder.dropped_hits >= engine.rlqs_stats.lost_hits


def test_the_plan_spreads_rlqs_gateways_or_takes_the_first_n() -> None:
    assert [RlqsPlan(0.5, None, ()).uses_rlqs(i) for i in range(4)] == [False, True, False, True]
    assert all(RlqsPlan(1.0, None, ()).uses_rlqs(i) for i in range(5))
    assert [RlqsPlan(1.0, 1, ()).uses_rlqs(i) for i in range(3)] == [True, False, False]
    assert engine_key_is_shared()


def engine_key_is_shared() -> bool:
    """RLQS usage lands on the same counter key the RLS path uses."""
    engine, _ = run_rlqs(
        "rlqs-half", EnvoyAssignment(Action.ALLOW_ALL, HOUR_MS), nodes=2, windows=3
    )
    return all(n.limiter.keys.get(KEY) is not None for n in engine.nodes.values())


def test_a_deny_all_just_before_a_bucket_makes_envoy_build_it_full() -> None:
    envoy = EnvoyBucket()
    envoy.assign(0, bucket(10, 1, HOUR_MS))
    assert admitted(envoy, range(10)) == 10
    fresh = EnvoyAssignment(Action.TOKEN_BUCKET, HOUR_MS, 12, 1, HOUR_MS, after_blanket=True)
    envoy.assign(100, fresh)
    assert admitted(envoy, range(100, 200)) == 12
