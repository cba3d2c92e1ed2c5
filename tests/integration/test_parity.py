"""Drop-in parity with envoyproxy/ratelimit, through a real grpc.aio server on loopback: quota
mode, dynamic metadata, request overrides of unmatched descriptors, whole-second resets, shadow
statuses (per rule, and the global --shadow-mode), and `cooldown: window_end`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

T0 = 1_700_000_040_000  # a minute boundary
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT

RULES = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {team: accounts, limits: {kind: per-user}}
  - key: export
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {limits: {kind: export, bucket: exports}, billing: quota}
  - key: report
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: late
    rate_limit: {unit: minute, requests_per_unit: 1, cooldown: window_end}
  - key: free
    rate_limit: {unlimited: true}
"""


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def serving(tmp_path: Path, clock: Clock, **options: Any) -> AsyncIterator[Any]:
    rules = load_rules(write_rules(tmp_path, RULES, "shop.yaml"))
    settings = Settings(config_path=str(tmp_path), grpc_address="127.0.0.1:0", **options)
    sidecar = Sidecar(settings, rules, clock_ms=clock)
    await sidecar.startup()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
            yield rls_stub(channel)
    finally:
        await sidecar.shutdown()


def codes(reply: wire.RateLimitResponse) -> tuple[int, list[int]]:
    return reply.overall_code, [status.code for status in reply.statuses]


Ask = Callable[..., Any]


async def test_quota_descriptors_refuse_only_when_all_are_over(tmp_path: Path) -> None:
    async with serving(tmp_path, Clock()) as stub:
        ask: Ask = lambda *d: stub.ShouldRateLimit(request("shop", *d))  # noqa: E731
        both = [("export", "e")], [("report", "r")]
        assert codes(await ask(*both)) == (OK, [OK, OK])
        # export is used up; report is not charged again (the first request counted it)
        one_over = await ask([("export", "e")], [("report", "r2")])
        assert codes(one_over) == (OK, [OVER, OK])
        assert one_over.statuses[0].current_limit.requests_per_unit == 1
        assert codes(await ask(*both)) == (OVER, [OVER, OVER])  # every quota descriptor over
        # a regular descriptor over its limit still refuses, whatever the quotas say
        for _ in range(2):
            await ask([("user", "u")])
        assert codes(await ask([("user", "u")], [("report", "r3")])) == (OVER, [OVER, OK])


async def test_a_request_let_through_by_quota_mode_counts_its_other_descriptors(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, Clock()) as stub:
        await stub.ShouldRateLimit(request("shop", [("export", "x")]))
        replies = [
            await stub.ShouldRateLimit(request("shop", [("export", "x")], [("report", "y")]))
            for _ in range(2)
        ]
        # the first is let through (report still had room) and charged report's one request
        assert [codes(r) for r in replies] == [(OK, [OVER, OK]), (OVER, [OVER, OVER])]


async def test_global_quota_mode_puts_every_limited_descriptor_in_quota(tmp_path: Path) -> None:
    async with serving(tmp_path, Clock(), quota_mode=True) as stub:
        for _ in range(2):
            await stub.ShouldRateLimit(request("shop", [("user", "q")]))
        mixed = await stub.ShouldRateLimit(request("shop", [("user", "q")], [("user", "other")]))
        assert codes(mixed) == (OK, [OVER, OK])
        alone = await stub.ShouldRateLimit(request("shop", [("user", "q")]))
        assert codes(alone) == (OVER, [OVER])


async def test_dynamic_metadata_carries_the_passing_descriptors_metadata(tmp_path: Path) -> None:
    async with serving(tmp_path, Clock(), response_dynamic_metadata=True) as stub:
        message = request("shop", [("user", "m")], [("export", "m")], hits_addend=1)
        message.descriptors[1].limit.requests_per_unit = 9  # an override: no metadata of its own
        message.descriptors[1].limit.unit = wire.RateLimitUnit.HOUR
        first = MessageToDict((await stub.ShouldRateLimit(message)).dynamic_metadata)
        assert first == {
            "domain": "shop",
            "descriptors": [
                {"entries": ["user=m"]},
                {"entries": ["export=m"], "limit": "requests_per_unit: 9 unit: HOUR"},
            ],
            "hitsAddend": 1.0,
            "metadata": {"team": "accounts", "limits": {"kind": "per-user"}},
        }
        plain = request("shop", [("user", "n")], [("export", "n")])
        merged = MessageToDict((await stub.ShouldRateLimit(plain)).dynamic_metadata)
        # first value wins, mappings merge key by key, in request order
        assert merged["metadata"] == {
            "team": "accounts",
            "limits": {"kind": "per-user", "bucket": "exports"},
            "billing": "quota",
        }
        refused = MessageToDict((await stub.ShouldRateLimit(plain)).dynamic_metadata)
        assert refused["metadata"] == {"team": "accounts", "limits": {"kind": "per-user"}}
        unknown = await stub.ShouldRateLimit(request("elsewhere", [("a", "b")]))
        assert MessageToDict(unknown.dynamic_metadata)["domain"] == "elsewhere"


async def test_no_dynamic_metadata_unless_asked(tmp_path: Path) -> None:
    async with serving(tmp_path, Clock()) as stub:
        reply = await stub.ShouldRateLimit(request("shop", [("user", "m")]))
        assert not reply.HasField("dynamic_metadata")


async def test_an_override_applies_to_an_unmatched_descriptor_of_a_known_domain(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, Clock()) as stub:
        message = request("shop", [("nothing", "matches"), ("here", "x")])
        message.descriptors[0].limit.requests_per_unit = 2
        message.descriptors[0].limit.unit = wire.RateLimitUnit.MINUTE
        replies = [await stub.ShouldRateLimit(message) for _ in range(3)]
        assert [codes(r) for r in replies] == [(OK, [OK]), (OK, [OK]), (OVER, [OVER])]
        assert replies[0].statuses[0].current_limit.requests_per_unit == 2
        assert replies[0].statuses[0].limit_remaining == 1
        other = request("shop", [("nothing", "else"), ("here", "x")])
        other.descriptors[0].limit.CopyFrom(message.descriptors[0].limit)
        assert codes(await stub.ShouldRateLimit(other)) == (OK, [OK])  # a counter per value
        message.domain = "elsewhere"  # an unknown domain stays unlimited, as in the reference
        assert codes(await stub.ShouldRateLimit(message)) == (OK, [OK])


async def test_resets_are_whole_seconds_rounded_up(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, clock) as stub:
        clock.now = T0 + 59_054  # 946 ms before the window ends
        for expected in (OK, OVER):
            reply = await stub.ShouldRateLimit(request("shop", [("late", "w")]))
            reset = reply.statuses[0].duration_until_reset
            assert (reply.overall_code, reset.seconds, reset.nanos) == (expected, 1, 0)
        headers = {h.key: h.value for h in reply.response_headers_to_add}
        assert headers["retry-after"] == "1"
        clock.now = T0 + 60_000  # cooldown: window_end admits again at the boundary
        assert codes(await stub.ShouldRateLimit(request("shop", [("late", "w")]))) == (OK, [OK])


async def test_a_shadow_rule_reports_limit_remaining_and_reset(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, clock) as stub:
        clock.now = T0 + 15_500
        replies = [await stub.ShouldRateLimit(request("shop", [("beta", "b")])) for _ in range(3)]
        assert [codes(r) for r in replies] == [(OK, [OK])] * 3
        statuses = [r.statuses[0] for r in replies]
        assert [s.current_limit.requests_per_unit for s in statuses] == [2, 2, 2]
        assert [s.limit_remaining for s in statuses] == [1, 0, 0]
        assert statuses[0].duration_until_reset.seconds == 45  # 44.5 s, rounded up


async def test_global_shadow_mode_keeps_each_status_and_answers_ok(tmp_path: Path) -> None:
    async with serving(tmp_path, Clock(), shadow_mode=True) as stub:
        for _ in range(2):
            await stub.ShouldRateLimit(request("shop", [("user", "s")]))
        reply = await stub.ShouldRateLimit(request("shop", [("user", "s")], [("user", "t")]))
        assert codes(reply) == (OK, [OVER, OK])
        over, within = reply.statuses
        assert (over.current_limit.requests_per_unit, over.limit_remaining) == (2, 0)
        assert over.duration_until_reset.seconds > 0
        assert within.limit_remaining == 1  # let through, so counted
        assert not reply.response_headers_to_add  # no 429 extras on an OK answer
