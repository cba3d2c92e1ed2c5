"""StreamRateLimitQuotas through a real grpc.aio server on loopback, in-process, local-only mode,
on a fake clock (the answers' numbers are exact); the process and Redis ones are in
test_rlqs_service.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.rlqs_client import QuotaStream, bucket_key
from harness.rules import write_rules
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.envoy.type.v3.ratelimit_strategy_pb2 import RateLimitStrategy
from ratelimit_sidecar.app.settings import TRANSPORTS, Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

T0 = 1_700_000_040_000  # a minute boundary
RULES = """\
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: client
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 10, spans: 2, cooldown: 3s}
  - {key: tier, value: internal, rate_limit: {unlimited: true}}
"""
ALICE = {"api_key": "alice"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=TRANSPORTS)
async def sidecar(
    tmp_path: Path, clock: Clock, request: pytest.FixtureRequest
) -> AsyncIterator[Sidecar]:
    rules = load_rules(write_rules(tmp_path, RULES, "shop.yaml"))
    settings = Settings(
        config_path=str(tmp_path), grpc_address="127.0.0.1:0", transport=request.param
    )
    server = Sidecar(settings, rules, clock_ms=clock)
    await server.startup()
    yield server
    await server.shutdown()


@pytest.fixture
async def channel(sidecar: Sidecar) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as chan:
        yield chan


@pytest.fixture
async def stream(channel: grpc.aio.Channel) -> AsyncIterator[QuotaStream]:
    quota = QuotaStream(channel, "shop")
    yield quota
    await quota.close()


def token_bucket(action: object) -> tuple[int, int, int, int]:
    """(max_tokens, tokens_per_fill, fill_interval s, ttl s) of a token bucket assignment."""
    assignment = action.quota_assignment_action  # type: ignore[attr-defined]
    bucket = assignment.rate_limit_strategy.token_bucket
    ttl = assignment.assignment_time_to_live.seconds
    return bucket.max_tokens, bucket.tokens_per_fill.value, bucket.fill_interval.seconds, ttl


def blanket(action: object) -> int:
    strategy = action.quota_assignment_action.rate_limit_strategy  # type: ignore[attr-defined]
    assert strategy.WhichOneof("strategy") == "blanket_rule"
    return int(strategy.blanket_rule)


async def test_a_new_bucket_gets_its_assignment_on_its_first_report(stream: QuotaStream) -> None:
    got = await stream.exchange((ALICE, 1, 0))
    assert token_bucket(got[bucket_key(ALICE)]) == (99, 1, 60, 30)


async def test_an_rlqs_stream_and_a_should_rate_limit_client_count_one_limit(
    stream: QuotaStream, channel: grpc.aio.Channel, sidecar: Sidecar
) -> None:
    """Entries of a bucket id (a map) are ordered by the rule tree: the counter is the one a
    descriptor (api_key, path) counts under."""
    bucket = {"path": "/v1/orders", "api_key": "bob"}
    got = await stream.exchange((bucket, 15, 0))
    assert token_bucket(got[bucket_key(bucket)])[0] == 5
    entries = [("api_key", "bob"), ("path", "/v1/orders")]
    answer = await rls_stub(channel).ShouldRateLimit(request("shop", entries, hits_addend=5))
    assert answer.overall_code == wire.Code.OK
    assert answer.statuses[0].limit_remaining == 0
    answer = await rls_stub(channel).ShouldRateLimit(request("shop", entries))
    assert answer.overall_code == wire.Code.OVER_LIMIT
    assert sidecar.limiter.keys.get(("shop", *sum(entries, ()))) is not None


async def test_only_meaningful_changes_are_sent(
    stream: QuotaStream, channel: grpc.aio.Channel, clock: Clock
) -> None:
    """Spending its own bucket is no news to the gateway; others spending the same limit is."""
    await stream.exchange((ALICE, 1, 0))
    clock.now += 5000
    got = await stream.exchange((ALICE, 30, 0), ({"client": "c"}, 1, 0))
    assert list(got) == [bucket_key({"client": "c"})]  # alice: holds 69, would get 69
    others = request("shop", [("api_key", "alice")], hits_addend=40)
    await rls_stub(channel).ShouldRateLimit(others)
    clock.now += 5000
    got = await stream.exchange((ALICE, 0, 0))
    assert token_bucket(got[bucket_key(ALICE)])[0] == 29  # 100 - 1 - 30 - 40


async def test_over_the_limit_denies_until_the_block_ends_and_is_pushed_back_then(
    stream: QuotaStream, clock: Clock
) -> None:
    client = {"client": "c"}
    got = await stream.exchange((client, 15, 0))  # 15 of 10: nothing left by the estimate
    assert blanket(got[bucket_key(client)]) == RateLimitStrategy.DENY_ALL
    clock.now += 5000  # the span ends: 15 over 10 for sure, blocked for the 3 s cooldown
    got = await stream.exchange((client, 0, 0))
    action = got[bucket_key(client)]
    assert blanket(action) == RateLimitStrategy.DENY_ALL
    assert action.quota_assignment_action.assignment_time_to_live.seconds == 4  # 3 s + 1
    clock.now += 5000  # a new window: the server sends the new assignment by itself
    response = await stream.next(timeout_s=5.0)
    assert response is not None
    (pushed,) = response.bucket_action
    assert token_bucket(pushed) == (10, 1, 100, 30)


async def test_unknown_buckets_and_domains_are_allowed_all(
    channel: grpc.aio.Channel, stream: QuotaStream
) -> None:
    nobody = {"nope": "x"}
    got = await stream.exchange((nobody, 3, 0), ({"tier": "internal"}, 1, 0))
    assert blanket(got[bucket_key(nobody)]) == RateLimitStrategy.ALLOW_ALL
    assert blanket(got[bucket_key({"tier": "internal"})]) == RateLimitStrategy.ALLOW_ALL
    other = QuotaStream(channel, "no-such-domain")
    got = await other.exchange((ALICE, 1, 0))
    assert blanket(got[bucket_key(ALICE)]) == RateLimitStrategy.ALLOW_ALL
    await other.close()


async def test_idle_buckets_are_abandoned(stream: QuotaStream, sidecar: Sidecar) -> None:
    await stream.exchange((ALICE, 1, 0))
    policy = sidecar.quota.service.policy
    for _ in range(policy.abandon_after_reports - 1):
        await stream.report((ALICE, 0, 0))
    got = await stream.exchange((ALICE, 0, 0))
    assert got[bucket_key(ALICE)].WhichOneof("bucket_action") == "abandon_action"


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (("", ALICE), "must name its domain"),
        (("shop", {}), "empty bucket id"),
        (("shop", {"k" * 2000: "v"}), "longer than"),
    ],
)
async def test_bad_input_ends_the_stream_with_invalid_argument(
    channel: grpc.aio.Channel, first: tuple[str, dict[str, str]], reason: str
) -> None:
    domain, bucket = first
    quota = QuotaStream(channel, "shop")
    await quota.report((bucket, 1, 0), domain=domain)
    assert await quota.next() is None
    assert await quota.status() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in await quota.call.details()
    await quota.close()


async def test_shutdown_ends_streams_cleanly(sidecar: Sidecar, stream: QuotaStream) -> None:
    await stream.exchange((ALICE, 7, 0))
    await asyncio.wait_for(sidecar.shutdown(), 10)
    assert await stream.next() is None
    assert await stream.status() == grpc.StatusCode.OK


async def test_reports_feed_the_rlqs_metrics(stream: QuotaStream, sidecar: Sidecar) -> None:
    await stream.exchange((ALICE, 4, 2), ({"nope": "x"}, 0, 1))
    registry = sidecar.metrics.registry
    name = "ratelimit_sidecar_rlqs_"
    assert registry.get_sample_value(name + "requests_total", {"result": "allowed"}) == 4
    assert registry.get_sample_value(name + "requests_total", {"result": "denied"}) == 3
    assert registry.get_sample_value(name + "reports_total") == 2
    assert registry.get_sample_value(name + "streams") == 1
    sent = {"action": "token_bucket"}
    assert registry.get_sample_value(name + "assignments_total", sent) == 1


def _stream_waiters() -> list[asyncio.Task[object]]:
    """Tasks waiting for a stream's next report or for shutdown (rlqs_api's `_next`)."""
    names = ("Queue.get", "Event.wait")
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ in names]  # type: ignore[union-attr]


async def test_cancelled_streams_leave_no_waiting_task(channel: grpc.aio.Channel) -> None:
    """Envoy gone mid-stream: grpc cancels the handler while it waits for a report, and the
    waits it started go with it."""
    before = len(_stream_waiters())
    streams = [QuotaStream(channel, "shop") for _ in range(40)]
    for quota in streams:
        await quota.exchange((ALICE, 0, 0))  # each handler now waits for its next report
    for quota in streams:
        quota.call.cancel()
        await quota.close()
    deadline = asyncio.get_running_loop().time() + 5
    while len(_stream_waiters()) > before and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert len(_stream_waiters()) <= before, [t.get_coro() for t in _stream_waiters()][:3]
