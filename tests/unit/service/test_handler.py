"""ShouldRateLimit semantics without a network: the handler on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.response import ResponseOptions

T0 = 1_700_000_040_000
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT
RULES = """\
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: vip
    rate_limit: {unlimited: true, replaces: [{name: per-user}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def handler(tmp_path: Path, ietf: bool = False) -> RateLimitHandler:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    options = ResponseOptions(ietf_headers=ietf)
    return RateLimitHandler(load_rules(path), FleetLimiter(), lambda: T0, options=options)


def decide(h: RateLimitHandler, message: wire.RateLimitRequest) -> wire.RateLimitResponse:
    """The handler answers wire bytes; parse them with the generated classes."""
    return wire.RateLimitResponse.FromString(answer_now(h, message.SerializeToString()))


def codes(h: RateLimitHandler, *entries: list[tuple[str, str]], times: int) -> list[int]:
    return [decide(h, request("d", *entries)).overall_code for _ in range(times)]


def test_share_threshold_counts_every_matching_value_together(tmp_path: Path) -> None:
    h = handler(tmp_path)
    first = codes(h, [("files", "files/a")], times=2)
    assert first + codes(h, [("files", "files/b")], times=1) == [OK, OK, OVER]


def test_distinct_values_of_a_valueless_key_count_apart(tmp_path: Path) -> None:
    h = handler(tmp_path)
    assert codes(h, [("user", "a")], times=3) == [OK, OK, OVER]
    assert codes(h, [("user", "b")], times=1) == [OK]


def test_replaces_drops_the_named_limit(tmp_path: Path) -> None:
    h = handler(tmp_path)
    both = [("user", "a")], [("vip", "yes")]
    assert codes(h, *both, times=5) == [OK] * 5
    reply = decide(h, request("d", *both))
    assert not reply.statuses[0].HasField("current_limit")


def test_request_override_replaces_the_configured_numbers(tmp_path: Path) -> None:
    h = handler(tmp_path)
    message = request("d", [("user", "o")])
    message.descriptors[0].limit.requests_per_unit = 5
    message.descriptors[0].limit.unit = wire.RateLimitUnit.HOUR
    replies = [decide(h, message) for _ in range(6)]
    assert [r.overall_code for r in replies] == [OK] * 5 + [OVER]
    assert replies[0].statuses[0].current_limit.unit == wire.Unit.HOUR


def test_negative_hits_give_quota_back(tmp_path: Path) -> None:
    h = handler(tmp_path)
    assert codes(h, [("user", "n")], times=2) == [OK, OK]
    refund = request("d", [("user", "n")], hits_addend=2)
    refund.descriptors[0].is_negative_hits = True
    assert decide(h, refund).statuses[0].limit_remaining == 2
    assert codes(h, [("user", "n")], times=3) == [OK, OK, OVER]


@pytest.mark.parametrize("over", [False, True])
def test_ietf_headers_describe_the_tightest_limit(tmp_path: Path, over: bool) -> None:
    h = handler(tmp_path, ietf=True)
    for _ in range(3 if over else 1):
        reply = decide(h, request("d", [("user", "i")]))
    headers = {x.key: x.value for x in reply.response_headers_to_add}
    assert headers["ratelimit-policy"] == '"per-user";q=2;w=60'
    assert headers["ratelimit"] == f'"per-user";r={0 if over else 1};t=60'


NAMES = ("RateLimit-Limit", "RateLimit-Remaining", "X-Reset")


def test_the_references_headers_describe_the_descriptor_closest_to_its_limit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    options = ResponseOptions(reference_headers=NAMES)
    h = RateLimitHandler(load_rules(path), FleetLimiter(), lambda: T0, options=options)
    entries = ([("user", "j")], [("files", "files/a")], [("free", "x")])
    replies = [decide(h, request("d", *entries)) for _ in range(3)]
    headers = [{x.key: x.value for x in r.response_headers_to_add} for r in replies]
    assert [hd["RateLimit-Remaining"] for hd in headers] == ["1", "0", "0"]
    assert {hd["RateLimit-Limit"] for hd in headers} == {"2"}
    assert headers[0]["X-Reset"] == "60"  # the minute window from T0 (a whole minute)
    assert replies[2].overall_code == OVER
    unlimited = decide(h, request("d", [("free", "y")]))
    assert not unlimited.response_headers_to_add  # no limit, no headers


@pytest.mark.parametrize(
    "entries",
    [
        [[("user", "a")]],
        [[("nothing", "x")], [("user", "a")]],
        [[("user", "a")], [("free", "y")]],
        [[("free", "y")], [("nothing", "x")], [("user", "a")], [("nothing", "z")]],
        [[("nothing", "x")], [("trial", "t")]],
        [[("user", "a")], [("user", "b")]],  # two counted: never the fast path
    ],
)
def test_the_fast_path_answers_byte_for_byte_as_the_general_path(
    tmp_path: Path, entries: list[list[tuple[str, str]]]
) -> None:
    (tmp_path / "d.yaml").write_text(RULES)
    rules = load_rules(tmp_path / "d.yaml")
    short = RateLimitHandler(rules, FleetLimiter(), lambda: T0)
    general = RateLimitHandler(rules, FleetLimiter(), lambda: T0, fast_path=False)
    raw = request("d", *entries).SerializeToString()
    answers = [
        (answer_now(short, raw), answer_now(general, raw)) for _ in range(4)
    ]  # OK, OK, OVER, OVER
    assert all(a == b for a, b in answers)
    assert {wire.RateLimitResponse.FromString(a).overall_code for a, _ in answers} == (
        {OK} if ("trial", "t") in entries[-1] else {OK, OVER}
    )


def test_a_lone_shadow_descriptor_over_its_limit_counts_as_shadow_not_within(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    metrics = Metrics()
    h = RateLimitHandler(load_rules(path), FleetLimiter(), lambda: T0, observer=metrics)
    replies = [decide(h, request("d", [("trial", "t")])) for _ in range(3)]  # 1 per minute
    assert [r.overall_code for r in replies] == [OK] * 3
    labels = {"domain": "d", "rule": "d.trial"}
    sample = metrics.registry.get_sample_value
    assert sample("ratelimit_sidecar_shadow_mode_total", labels) == 2
    assert sample("ratelimit_sidecar_within_limit_total", labels) == 1
