"""Runtime overrides on the request path: what they match, precedence, counters across changes."""

from __future__ import annotations

from pathlib import Path

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.overrides.applied import NO_OVERRIDES, AppliedOverrides
from ratelimit_sidecar.overrides.model import OverrideBounds, parse_override
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

T0 = 1_700_000_040_000  # a minute's start
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT
RULES = """\
domain: gateway
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _handler(tmp_path: Path, clock: Clock | None = None) -> RateLimitHandler:
    (tmp_path / "gateway.yaml").write_text(RULES)
    rules = load_rules(tmp_path / "gateway.yaml")
    return RateLimitHandler(rules, LocalLimiter(), clock or Clock())


def _overrides(*bodies: dict[str, object], version: int = 1) -> AppliedOverrides:
    return AppliedOverrides.of([parse_override(b, OverrideBounds()) for b in bodies], version)


def _body(
    domain: str, entries: list[tuple[str, str]], limit: dict[str, object]
) -> dict[str, object]:
    descriptor = [{"key": k, "value": v} for k, v in entries]
    return {"domain": domain, "descriptor": descriptor, "rate_limit": limit}


def _codes(h: RateLimitHandler, domain: str, entries: list[tuple[str, str]], n: int) -> list[int]:
    raw = request(domain, entries).SerializeToString()
    return [wire.RateLimitResponse.FromString(answer_now(h, raw)).overall_code for _ in range(n)]


def _reply(h: RateLimitHandler, message: wire.RateLimitRequest) -> wire.RateLimitResponse:
    return wire.RateLimitResponse.FromString(answer_now(h, message.SerializeToString()))


PER_MINUTE_5 = {"unit": "minute", "requests_per_unit": 5}


def test_an_override_replaces_the_files_limit_for_exactly_its_descriptor(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    h.swap_overrides(_overrides(_body("gateway", [("api_key", "pro")], PER_MINUTE_5)))

    assert _codes(h, "gateway", [("api_key", "pro")], 6) == [OK] * 5 + [OVER]
    assert _codes(h, "gateway", [("api_key", "free")], 4) == [OK] * 3 + [OVER]
    # Exactly those entries, in order: a longer descriptor is not the override's.
    assert _codes(h, "gateway", [("api_key", "pro"), ("path", "/")], 1) == [OK]


def test_an_override_applies_where_no_rule_matches_and_in_a_domain_without_rules(
    tmp_path: Path,
) -> None:
    h = _handler(tmp_path)
    deny = {"unit": "second", "requests_per_unit": 0}
    h.swap_overrides(
        _overrides(
            _body("gateway", [("user", "bot")], deny),
            _body("newdomain", [("tenant", "acme")], {"unit": "hour", "requests_per_unit": 1}),
        )
    )

    assert _codes(h, "gateway", [("user", "bot")], 1) == [OVER]
    assert _codes(h, "newdomain", [("tenant", "acme")], 2) == [OK, OVER]
    assert _codes(h, "newdomain", [("tenant", "other")], 2) == [OK, OK]  # matched nothing


def test_unlimited_override_is_an_allow_list(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    h.swap_overrides(_overrides(_body("gateway", [("api_key", "vip")], {"unlimited": True})))

    reply = _reply(h, request("gateway", [("api_key", "vip")]))
    assert _codes(h, "gateway", [("api_key", "vip")], 10) == [OK] * 10
    assert reply.statuses[0].limit_remaining == 2**32 - 1


def test_the_requests_own_limit_beats_an_override_which_beats_the_file(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    h.swap_overrides(_overrides(_body("gateway", [("api_key", "pro")], PER_MINUTE_5)))
    message = request("gateway", [("api_key", "pro")])
    message.descriptors[0].limit.requests_per_unit = 1
    message.descriptors[0].limit.unit = wire.RateLimitUnit.HOUR

    first, second = _reply(h, message), _reply(h, message)
    plain = _reply(h, request("gateway", [("api_key", "pro")]))

    assert (first.overall_code, second.overall_code) == (OK, OVER)
    assert first.statuses[0].current_limit.requests_per_unit == 1
    assert plain.statuses[0].current_limit.requests_per_unit == 5


def test_counts_carry_across_a_change_and_a_raised_limit_applies_to_them(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    assert _codes(h, "gateway", [("api_key", "k")], 4) == [OK, OK, OK, OVER]  # file: 3 a minute

    h.swap_overrides(_overrides(_body("gateway", [("api_key", "k")], PER_MINUTE_5)))
    assert _codes(h, "gateway", [("api_key", "k")], 3) == [OK, OK, OVER]  # 3 counted of 5

    h.swap_overrides(NO_OVERRIDES)  # deleted: the file's 3 again, the count goes on
    assert _codes(h, "gateway", [("api_key", "k")], 1) == [OVER]


def test_an_algorithm_change_starts_a_fresh_counter(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    _codes(h, "gateway", [("api_key", "k")], 3)
    bucket = {"unit": "minute", "requests_per_unit": 3, "algorithm": "token_bucket"}

    h.swap_overrides(_overrides(_body("gateway", [("api_key", "k")], bucket)))

    assert _codes(h, "gateway", [("api_key", "k")], 4) == [OK, OK, OK, OVER]


def test_a_rule_reload_keeps_the_overrides(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    h.swap_overrides(_overrides(_body("gateway", [("api_key", "pro")], PER_MINUTE_5)))

    h.swap_rules(load_rules(tmp_path / "gateway.yaml"))

    assert _codes(h, "gateway", [("api_key", "pro")], 6) == [OK] * 5 + [OVER]


def test_the_compiled_request_cache_is_cleared_when_the_set_changes(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    raw = request("gateway", [("api_key", "pro")]).SerializeToString()
    before = wire.RateLimitResponse.FromString(answer_now(h, raw))

    h.swap_overrides(_overrides(_body("gateway", [("api_key", "pro")], PER_MINUTE_5)))
    after = wire.RateLimitResponse.FromString(answer_now(h, raw))

    assert before.statuses[0].current_limit.requests_per_unit == 3
    assert after.statuses[0].current_limit.requests_per_unit == 5
