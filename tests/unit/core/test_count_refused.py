"""`count_refused: true` (a cost budget fed after the response): a refused request's hits are
spent all the same, so they count, as the reference counts them; without it a refusal costs
nothing."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import Code, FleetLimiter, Hit, SyncResult
from tests.unit.core.rules import rule

T0 = 1_700_000_040_000


def budget(count_refused: bool) -> Rule:
    plain = rule(rpu=10_000, spans=2)
    assert plain.limit is not None
    limit = replace(plain.limit, count_refused=count_refused)
    return replace(plain, limit=limit, limits=(limit,))


def spend(limiter: FleetLimiter, r: Rule, hits: int) -> Code:
    return limiter.hit(T0 + 1, [Hit(r, ("d", "k", "tenant"), hits)]).code


def test_a_refused_report_is_counted_when_the_rule_says_so() -> None:
    limiter, r = FleetLimiter(key_digest="|".join), budget(count_refused=True)
    assert spend(limiter, r, 9_000) is Code.OK
    assert spend(limiter, r, 5_000) is Code.OVER_LIMIT  # reported after the response: spent
    assert limiter.pending_hits() == 14_000
    assert spend(limiter, r, 0) is Code.OVER_LIMIT  # the next request's check: spent


def test_without_it_a_refused_request_costs_nothing() -> None:
    limiter, r = FleetLimiter(key_digest="|".join), budget(count_refused=False)
    assert spend(limiter, r, 9_000) is Code.OK
    assert spend(limiter, r, 5_000) is Code.OVER_LIMIT
    assert limiter.pending_hits() == 9_000  # the window's spend: unknown to the fleet


def test_the_counted_refusal_is_pushed_at_the_next_sync() -> None:
    limiter, r = FleetLimiter(key_digest="|".join), budget(count_refused=True)
    limiter.apply_sync(T0, limiter.end_span(T0), SyncResult(live_nodes=1))
    spend(limiter, r, 9_000)
    spend(limiter, r, 5_000)
    batch = limiter.end_span(T0 + 500)
    assert [push.hits for push in batch.pushes] == [14_000]
