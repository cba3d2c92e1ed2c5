"""Three sidecar processes share runtime overrides through one real Redis (issue #15).

A change made through one node's admin API is enforced by the others within a second (the
change message, then a full read); reconnection and full reads repair what a message missed;
Redis down keeps the set in force and refuses writes; a restarted node has the set before it
answers. The periodic full read is left at its default (10 s), longer than every bound here,
so these bounds are the messages' and the reconnections' own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.override_fleet import FILE_LIMIT, RULES, OverrideNode, all_at, wait_until
from harness.redis_servers import Cluster, ServerProcess
from harness.rules import write_rules

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WITHIN_S = 1.0  # the bound: every node applies a change within 1 s
PATIENCE_S = 5.0  # how long a check waits before it fails


@pytest.fixture(scope="module")
def redis(module_redis_server: ServerProcess) -> ServerProcess:
    return module_redis_server


@pytest.fixture(scope="module")
def fleet(
    redis: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[OverrideNode]]:
    rules = write_rules(tmp_path_factory.mktemp("rules"), RULES)
    nodes = [OverrideNode(rules, redis.url, f"n{i}") for i in range(3)]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def enforced_within(nodes: list[OverrideNode], value: str, limit: int) -> list[float]:
    """Seconds until each node enforced `limit` for `value` (the test fails past PATIENCE_S)."""
    took = [wait_until(node.enforces(value, limit), PATIENCE_S) for node in nodes]
    assert None not in took, f"not every node enforced {limit} for {value}: {took}"
    return [t for t in took if t is not None]


def test_a_put_on_one_node_is_enforced_by_the_others_within_a_second(
    fleet: list[OverrideNode],
) -> None:
    writer, others = fleet[0], fleet[1:]
    assert [node.limit("tk_put") for node in fleet] == [FILE_LIMIT] * 3
    code, answer = writer.put("tk_put", 500, note="upgraded")
    assert code == 200, answer
    assert writer.limit("tk_put") == 500  # the writer applies it before answering
    assert max(enforced_within(others, "tk_put", 500)) < WITHIN_S
    code, _ = others[0].admin("DELETE", f"/v1/overrides/{answer['id']}")
    assert code == 200
    assert max(enforced_within(fleet, "tk_put", FILE_LIMIT)) < WITHIN_S  # the file's limit
    lags = [
        line for line in others[1].metrics().splitlines() if "propagation_seconds_count" in line
    ]
    assert float(lags[0].split()[-1]) >= 2  # the put's lag and the delete's were observed


def test_an_override_expires_on_every_node_without_a_call(fleet: list[OverrideNode]) -> None:
    expires = int(time.time()) + 2
    stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, answer = fleet[1].put("tk_expiring", 300, expires_at=stamp)
    assert code == 200, answer
    enforced_within(fleet, "tk_expiring", 300)
    time.sleep(max(0.0, expires - time.time()))
    # Each node re-applies its set at the expiry by itself: nothing was written since.
    assert max(enforced_within(fleet, "tk_expiring", FILE_LIMIT)) < 0.5


def test_a_rollback_reaches_every_node(fleet: list[OverrideNode]) -> None:
    first = fleet[0].put("tk_a", 10)[1]
    fleet[1].put("tk_b", 20)
    fleet[2].admin("DELETE", f"/v1/overrides/{first['id']}")
    enforced_within(fleet, "tk_a", FILE_LIMIT)
    code, answer = fleet[2].admin("POST", "/v1/overrides/rollback", {"version": first["version"]})
    assert code == 200, answer
    assert max(enforced_within(fleet, "tk_a", 10)) < WITHIN_S
    enforced_within(fleet, "tk_b", FILE_LIMIT)  # tk_b came after that version
    assert wait_until(all_at(fleet, int(answer["version"])), PATIENCE_S) is not None  # type: ignore[call-overload]


def test_a_killed_subscription_still_gets_a_later_change(
    fleet: list[OverrideNode], redis: ServerProcess
) -> None:
    with redis.client() as admin:
        assert admin.client_kill_filter(_type="pubsub") >= 3  # every node's subscription
        fleet[0].put("tk_after_kill", 77)
    enforced_within(fleet, "tk_after_kill", 77)  # by the reconnection's full read, or a message
    fleet[1].put("tk_after_kill", 78)  # and the new subscriptions carry the next change
    assert max(enforced_within(fleet, "tk_after_kill", 78)) < WITHIN_S


def test_a_restarted_node_has_the_set_before_it_answers(fleet: list[OverrideNode]) -> None:
    node = fleet[2]
    node.stop()
    fleet[0].put("tk_while_away", 42)
    node.start()  # returns once gRPC serves: the first answer must already have the override
    assert node.limit("tk_while_away") == 42
    assert node.version() == fleet[0].version()


def test_redis_down_keeps_the_set_refuses_writes_and_converges_after(
    fleet: list[OverrideNode], redis: ServerProcess
) -> None:
    fleet[0].put("tk_kept", 55)
    enforced_within(fleet, "tk_kept", 55)
    version = fleet[0].version()
    redis.kill()  # no persistence: Redis comes back empty
    try:
        assert [node.limit("tk_kept") for node in fleet] == [55] * 3
        code, answer = fleet[1].put("tk_refused", 1)
        assert code == 503, answer
        code, _ = fleet[1].admin("DELETE", "/v1/overrides/anything")
        assert code == 503
        time.sleep(0.5)  # a while down: the set stays in force
        assert [node.limit("tk_kept") for node in fleet] == [55] * 3
    finally:
        redis.start()
    # Every node subscribes again (its pause between attempts grows to 5 s while Redis is down)
    # and reads the set in full: the first to read puts its last set back, at its version.
    with redis.client() as admin:
        channel = "rls:events:overrides"
        subscribed = lambda: admin.pubsub_numsub(channel)[0][1] == 3  # noqa: E731
        assert wait_until(subscribed, 10, interval_s=0.05) is not None
        assert (
            wait_until(
                lambda: admin.get("rls:{overrides}:version") == str(version).encode(), PATIENCE_S
            )
            is not None
        )
    assert fleet[2].admin("GET", "/v1/overrides")[1]["version"] == version
    assert [node.limit("tk_kept") for node in fleet] == [55] * 3
    assert all(node.applied()["store_up"] for node in fleet)
    code, answer = fleet[1].put("tk_after", 66)
    assert code == 200, answer
    assert max(enforced_within(fleet, "tk_after", 66)) < WITHIN_S
    assert [node.version() for node in fleet] == [int(answer["version"])] * 3  # type: ignore[call-overload]


def test_on_cluster_a_put_reaches_every_node(redis_cluster: Cluster, tmp_path: Path) -> None:
    """Cluster: the write runs on the overrides' slot's node; its announcement crosses the
    cluster bus to subscriptions made on any node."""
    rules = write_rules(tmp_path, RULES)
    nodes = [
        OverrideNode(rules, redis_cluster.url, f"c{i}", "--redis-prefix", "ovc:") for i in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        code, answer = nodes[0].put("tk_cluster", 321)
        assert code == 200, answer
        assert max(enforced_within(nodes[1:], "tk_cluster", 321)) < WITHIN_S
        code, _ = nodes[2].admin("DELETE", f"/v1/overrides/{answer['id']}")
        assert code == 200
        assert max(enforced_within(nodes, "tk_cluster", FILE_LIMIT)) < WITHIN_S
    finally:
        for node in nodes:
            node.stop()
