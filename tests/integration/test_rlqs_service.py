"""The Rate Limit Quota Service of real sidecar processes sharing a real Redis: an RLQS stream
(a Python client playing Envoy's filter) and ShouldRateLimit clients count one limit through the
same Redis keys. Windows are an hour (a test never straddles one) cut into 1 s spans."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.redis_servers import ServerProcess
from harness.rlqs_client import QuotaStream, actions, bucket_key
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.envoy.type.v3.ratelimit_strategy_pb2 import RateLimitStrategy
from ratelimit_sidecar.storage.keys import KeySchema, span_suffix

pytestmark = [pytest.mark.integration]

MAX, LEASED_MAX, WINDOW_MS = 10, 40, 3_600_000
RULES = f"""\
domain: shop
descriptors:
  - key: client
    rate_limit: {{unit: hour, requests_per_unit: {MAX}, spans: 3600, cooldown: 5s}}
  - key: leased
    rate_limit: {{unit: minute, requests_per_unit: {LEASED_MAX}, spans: 60, consistency: strict}}
  - key: rolled
    rate_limit: {{unit: second, requests_per_unit: {LEASED_MAX}, spans: 2, consistency: strict}}
  - key: daily
    rate_limit: {{unit: day, requests_per_unit: {MAX}}}
  - key: trailing
    rate_limit:
      {{unit: minute, requests_per_unit: {LEASED_MAX}, algorithm: sliding_window, spans: 60,
       consistency: strict}}
"""
SYNC_S = 2.5  # two 1 s spans and slack: a count pushed by one node is read by the other


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"rlqs-{uuid.uuid4().hex[:8]}:"


def start_nodes(
    config: Path, redis: ServerProcess, prefix: str, count: int
) -> list[SidecarProcess]:
    rules = write_rules(config, RULES, "shop.yaml")
    extra = ("--redis-url", redis.url, "--redis-prefix", prefix)
    started = [SidecarProcess(rules, *extra, "--node-id", f"q{i}") for i in range(count)]
    return [node.wait_ready() for node in started]


@pytest.fixture(scope="module")
def nodes(
    tmp_path_factory: pytest.TempPathFactory, redis_server: ServerProcess, prefix: str
) -> Iterator[list[SidecarProcess]]:
    """Two sidecars for the module's tests (each test uses keys of its own)."""
    started = start_nodes(tmp_path_factory.mktemp("rlqs"), redis_server, prefix, 2)
    try:
        yield started
    finally:
        for node in started:
            node.stop()


@pytest.fixture
async def rlqs_node(nodes: list[SidecarProcess]) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(nodes[0].address) as channel:
        yield channel


@pytest.fixture
async def rls_node(nodes: list[SidecarProcess]) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(nodes[1].address) as channel:
        yield channel


@pytest.fixture
async def stream(rlqs_node: grpc.aio.Channel) -> AsyncIterator[QuotaStream]:
    quota = QuotaStream(rlqs_node, "shop")
    yield quota
    await quota.close()


def redis_count(
    server: ServerProcess,
    prefix: str,
    value: str,
    key_name: str = "client",
    window_ms: int = WINDOW_MS,
) -> int:
    key = ("shop", key_name, value)
    name = KeySchema(prefix).counter(key, int(time.time() * 1000) // window_ms)
    with server.client() as client:
        return int(client.get(name) or 0)


def strategy(action: object) -> object:
    return action.quota_assignment_action.rate_limit_strategy  # type: ignore[attr-defined]


async def test_a_new_bucket_gets_a_token_bucket_on_its_first_report(stream: QuotaStream) -> None:
    got = await stream.exchange(({"client": "new"}, 1, 0))
    assignment = got[bucket_key({"client": "new"})].quota_assignment_action
    bucket = assignment.rate_limit_strategy.token_bucket
    assert 1 <= bucket.max_tokens <= MAX - 1
    assert bucket.tokens_per_fill.value >= 1 and bucket.fill_interval.seconds >= 1
    assert assignment.assignment_time_to_live.seconds >= 10


async def test_reported_usage_and_should_rate_limit_share_one_redis_counter(
    stream: QuotaStream, rls_node: grpc.aio.Channel, redis_server: ServerProcess, prefix: str
) -> None:
    """8 reported by the RLQS gateway, then ShouldRateLimit requests on the other node: the
    push of 8 took the window past half its limit, so Redis announced it (core/quiet_keys.py)
    and the other node's new key starts from 8; the Redis counter holds both paths' counts,
    and once it is over the limit both refuse."""
    shared = {"client": "shared"}
    await stream.exchange((shared, 8, 0))
    await asyncio.sleep(SYNC_S)
    assert redis_count(redis_server, prefix, "shared") == 8  # the RLQS node pushed the report
    rls = rls_stub(rls_node)
    call = request("shop", [("client", "shared")])
    answers = [(await rls.ShouldRateLimit(call)).overall_code for _ in range(5)]
    admitted = answers.count(wire.Code.OK)
    assert admitted == 2  # 8 + 2 = 10
    await asyncio.sleep(SYNC_S)
    assert redis_count(redis_server, prefix, "shared") == 8 + admitted  # one counter, both paths
    assert (await rls.ShouldRateLimit(call)).overall_code == wire.Code.OVER_LIMIT
    # The RLQS node learns the fleet's total when it next pushes the key: the gateway spends
    # at most its share of what it believed was left (here 1), reports it, and is denied.
    await stream.report((shared, 0, 2))
    earlier = await stream.latest(shared)
    if earlier is not None and strategy(earlier).WhichOneof("strategy") == "token_bucket":  # type: ignore[attr-defined]
        assert strategy(earlier).token_bucket.max_tokens <= 1  # type: ignore[attr-defined]
    await stream.report((shared, 1, 0))
    await asyncio.sleep(SYNC_S)
    # The DENY_ALL may already have come with the earlier answers (a sync in between): an
    # unchanged assignment is not sent again.
    last = await stream.latest(shared) or earlier
    assert last is not None
    assert strategy(last).blanket_rule == RateLimitStrategy.DENY_ALL  # type: ignore[attr-defined]


async def test_over_the_limit_is_deny_all_until_the_window_resets(
    stream: QuotaStream, rls_node: grpc.aio.Channel
) -> None:
    over = {"client": "over"}
    await stream.exchange((over, 15, 3))
    await asyncio.sleep(SYNC_S)  # the store's total, 15 of 10, blocks the key for 5 s
    got = await stream.exchange((over, 0, 4))
    action = got[bucket_key(over)]
    assert strategy(action).blanket_rule == RateLimitStrategy.DENY_ALL  # type: ignore[attr-defined]
    ttl = action.quota_assignment_action.assignment_time_to_live.seconds
    # 15 of 10 stays over until the hour ends: denied until then (the refusal's wait: the
    # window's end, plus the 5 s block a last sync may re-arm, plus a second).
    window_left_s = (WINDOW_MS - int(time.time() * 1000) % WINDOW_MS) // 1000
    assert window_left_s - 2 <= ttl <= window_left_s + 5 + 3
    # The other node decides a key it has never seen from memory; its first sync brings the
    # store's total, and the block.
    rls, call = rls_stub(rls_node), request("shop", [("client", "over")])
    await rls.ShouldRateLimit(call)
    await asyncio.sleep(SYNC_S)
    assert (await rls.ShouldRateLimit(call)).overall_code == wire.Code.OVER_LIMIT


async def test_a_daily_key_near_its_limit_is_pushed_at_once_and_denied_on_the_other_node(
    nodes: list[SidecarProcess],
    stream: QuotaStream,
    rls_node: grpc.aio.Channel,
    redis_server: ServerProcess,
    prefix: str,
) -> None:
    """A day's window (4 h spans) at the edge: the report that takes it to 9 of 10 reaches
    Redis at once, and the other node, which never saw the key, denies after one more."""
    daily, notices = {"daily": "k"}, "edge_notices_received_total"
    heard = nodes[1].metric(notices)
    await stream.exchange((daily, 9, 0))
    deadline = time.monotonic() + 1.0
    while redis_count(redis_server, prefix, "k", "daily", 86_400_000) < 9:
        assert time.monotonic() < deadline, "the report waited for its span end"
        await asyncio.sleep(0.02)
    while nodes[1].metric(notices) <= heard:  # the push's announcement
        assert time.monotonic() < deadline + 2, "the other node never heard the push"
        await asyncio.sleep(0.02)
    other = QuotaStream(rls_node, "shop")
    try:
        got = (await other.exchange((daily, 1, 0)))[bucket_key(daily)]
        last = strategy(await other.latest(daily, 1.5) or got)
        assert last.blanket_rule == RateLimitStrategy.DENY_ALL, last  # type: ignore[attr-defined]
    finally:
        await other.close()


async def test_an_unchanged_assignment_is_not_sent_again(stream: QuotaStream) -> None:
    steady = {"client": "steady"}
    await stream.exchange((steady, 1, 0))
    await stream.report((steady, 0, 0))
    with pytest.raises(TimeoutError):
        await stream.next(timeout_s=1.0)


async def test_a_bucket_no_rule_matches_is_allowed_all(stream: QuotaStream) -> None:
    got = await stream.exchange(({"user": "x"}, 3, 0))
    assert strategy(got[bucket_key({"user": "x"})]).blanket_rule == RateLimitStrategy.ALLOW_ALL  # type: ignore[attr-defined]


async def test_sigterm_ends_the_stream_and_flushes_the_reported_hits(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    prefix = f"rlqs-{uuid.uuid4().hex[:8]}:"
    (node,) = start_nodes(tmp_path, redis_server, prefix, 1)
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            quota = QuotaStream(channel, "shop")
            await quota.exchange(({"client": "flushed"}, 3, 0))
            assert node.stop() == 0
            assert await quota.next() is None
            assert await quota.status() == grpc.StatusCode.OK
            await quota.close()
    finally:
        node.stop()
    assert redis_count(redis_server, prefix, "flushed") == 3


async def lease_of(stream: QuotaStream, bucket: dict[str, str]) -> int:
    """Report a first request; the token bucket the stream holds once answers stop coming."""
    answer = (await stream.exchange((bucket, 1, 0)))[bucket_key(bucket)]
    got = strategy(await stream.latest(bucket, 0.5) or answer)
    assert got.WhichOneof("strategy") == "token_bucket", got  # type: ignore[attr-defined]
    return int(got.token_bucket.max_tokens)  # type: ignore[attr-defined]


async def test_leases_reach_redis_before_they_are_spent_and_add_up_to_at_most_max(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    """`consistency: strict`, two sidecars each with a gateway: a lease is counted in Redis at once
    (not at the 1 s span end), and the second node leases from what the first left."""
    lease_prefix = f"lease-{uuid.uuid4().hex[:8]}:"
    pair = start_nodes(tmp_path, redis_server, lease_prefix, 2)
    bucket = {"leased": "k"}
    try:
        if time.time() % 60 > 30:  # leased windows are a minute at most: run within one
            await asyncio.sleep(60.5 - time.time() % 60)
        deadline = time.monotonic() + 15
        while min(node.metric("live_nodes") for node in pair) < 2:  # each leases a half
            assert time.monotonic() < deadline, "the sidecars never counted each other"
            await asyncio.sleep(0.1)
        async with (
            grpc.aio.insecure_channel(pair[0].address) as first_channel,
            grpc.aio.insecure_channel(pair[1].address) as second_channel,
        ):
            first, second = QuotaStream(first_channel, "shop"), QuotaStream(second_channel, "shop")
            granted = await lease_of(first, bucket)  # a first lease, then one past its push
            stored = redis_count(redis_server, lease_prefix, "k", "leased", 60_000)
            assert stored >= granted + 1, (stored, granted)  # counted before it is spent
            other = await lease_of(second, bucket)
            assert granted + other + 2 <= LEASED_MAX, (granted, other)
            assert other >= 5, (granted, other)  # the second gateway is not shut out
            await first.close()
            await second.close()
    finally:
        for node in pair:
            node.stop()


async def test_a_lease_is_abandoned_at_its_windows_end_and_leased_again_when_made_anew(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    """`consistency: strict`, a one-second window: at its end the stream abandons the bucket (Envoy
    drops it and its unreported usage); the report of the request that makes it anew gets a
    new lease."""
    prefix = f"roll-{uuid.uuid4().hex[:8]}:"
    (node,) = start_nodes(tmp_path, redis_server, prefix, 1)
    bucket = {"rolled": "k"}
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stream = QuotaStream(channel, "shop")
            await stream.report((bucket, 1, 0))
            assert await next_action(stream, bucket) == "token_bucket"
            assert await next_action(stream, bucket, until="abandon") == "abandon"
            await stream.report((bucket, 1, 0))  # the request that makes it anew
            assert await next_action(stream, bucket) == "token_bucket"
            assert node.metric('rlqs_assignments_total{action="abandon"}') >= 1
            await stream.close()
    finally:
        node.stop()


async def test_a_strict_sliding_windows_lease_moves_to_the_span_now_in_redis(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    """`consistency: strict` on a sliding window: leased, and at each span end (1 s) what the
    bucket has not reported spent moves in Redis to the span of that sync, so it never leaves
    the trailing window before the requests it may admit."""
    prefix = f"trail-{uuid.uuid4().hex[:8]}:"
    (node,) = start_nodes(tmp_path, redis_server, prefix, 1)
    key, schema = ("shop", "trailing", "k"), KeySchema(prefix)
    try:
        async with grpc.aio.insecure_channel(node.address) as channel:
            stream = QuotaStream(channel, "shop")
            first = int(time.time())  # the span (1 s) of the first report
            granted = await lease_of(stream, {"trailing": "k"})
            await asyncio.sleep(2.5)  # two span ends
            now = int(time.time())
            with redis_server.client() as client:
                spans = [
                    int(client.get(schema.tag(key) + span_suffix(key, s)) or 0)
                    for s in range(first, now + 1)
                ]
            assert sum(spans) >= granted + 1, spans  # the lease and the first request
            assert spans[-1] + spans[-2] >= granted > spans[0], spans
            await stream.close()
    finally:
        node.stop()


async def next_action(stream: QuotaStream, bucket: dict[str, str], until: str = "") -> str:
    """The first action for `bucket` (`until`: the first of that kind) within 3 s: "abandon",
    or the assignment's strategy ("token_bucket", "blanket_rule")."""
    deadline = time.monotonic() + 3
    while True:
        response = await stream.next(timeout_s=max(0.1, deadline - time.monotonic()))
        assert response is not None, f"no {until or 'action'} for {bucket} within 3 s"
        got = actions(response).get(bucket_key(bucket))
        if got is None:
            continue
        kind = "abandon" if got.WhichOneof("bucket_action") == "abandon_action" else ""
        kind = kind or str(strategy(got).WhichOneof("strategy"))  # type: ignore[attr-defined]
        if not until or kind == until:
            return kind
