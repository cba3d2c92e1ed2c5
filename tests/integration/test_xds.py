"""Rules from an xDS control plane: an ADS server on loopback drives a fleet of sidecar
processes sharing Redis (pushes, NACKs, the control plane killed and restarted)."""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.net import free_ports
from harness.override_fleet import TOKEN
from harness.redis_servers import ServerProcess
from harness.sidecar import SidecarProcess, run_cli
from harness.xds_server import (
    GATEWAY_DOMAIN,
    GATEWAY_PREFIX,
    AdsServer,
    gateway_config,
)
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls

pytestmark = pytest.mark.integration

# Fast backoff for tests: 0.2 s doubling up to 1 s (each delay at least half of that).
RETRY = ("--config-xds-retry-s", "0.2", "--config-xds-retry-max-s", "1")
NODE = ("--config-xds-node-id", "envoy-ratelimit")
_addresses = (f"10.0.{i // 250}.{i % 250}" for i in itertools.count())


@pytest.fixture(scope="module")
def ads() -> Iterator[AdsServer]:
    server = AdsServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fleet(ads: AdsServer, module_redis_server: ServerProcess) -> Iterator[list[SidecarProcess]]:
    """Three sidecars on xDS rules, counting together in one Redis; no rules pushed yet."""
    redis = ("--redis-url", module_redis_server.url, "--redis-prefix", "xds:")
    nodes: list[SidecarProcess] = []
    try:
        for name in ("n1", "n2", "n3"):
            extra = ("--config-xds", ads.address, *NODE, *RETRY, *redis, "--node-id", name)
            nodes.append(SidecarProcess(None, *extra).wait_ready())
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def decide_at(target: str, address: str) -> wire.DescriptorStatus:
    """The status a client at `address` gets from the sidecar at `target` (host:port)."""
    with grpc.insecure_channel(target) as channel:
        message = request(GATEWAY_DOMAIN, [*GATEWAY_PREFIX, ("remote_address", address)])
        reply = rls_stub(channel).ShouldRateLimit(message, timeout=5)
    status: wire.DescriptorStatus = reply.statuses[0]
    return status


def decide(node: SidecarProcess, address: str) -> wire.DescriptorStatus:
    return decide_at(node.address, address)


def limit_at(target: str) -> int:
    """The limit a new client address gets from the sidecar at `target` (0: no rule matched)."""
    return int(decide_at(target, next(_addresses)).current_limit.requests_per_unit)


def limit_seen(node: SidecarProcess) -> int:
    return limit_at(node.address)


def get(node: SidecarProcess, path: str) -> tuple[int, dict[str, object]]:
    url = f"http://127.0.0.1:{node.metrics_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def connected(node: SidecarProcess) -> bool:
    source = get(node, "/readyz")[1]["config_source"]
    return isinstance(source, dict) and source["connected"] is True


def fleet_limit_is(fleet: list[SidecarProcess], limit: int) -> bool:
    return all(limit_seen(node) == limit for node in fleet)


def answered_by_all(ads: AdsServer, version: str, fleet: list[SidecarProcess]) -> bool:
    return len(ads.answers_to(version)) == len(fleet)


def wait_for(check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_not_ready_until_the_first_configuration(
    fleet: list[SidecarProcess], ads: AdsServer
) -> None:
    for node in fleet:
        wait_for(partial(connected, node), 5)
        status, body = get(node, "/readyz")
        assert status == 503 and body["ready"] is False
    ads.push([gateway_config(5)], "v1")
    wait_for(lambda: all(get(n, "/readyz")[0] == 200 for n in fleet), 2)
    assert [limit_seen(node) for node in fleet] == [5, 5, 5]
    _, rules = get(fleet[0], "/debug/rules")
    source = rules["source"]
    assert isinstance(source, dict)
    assert (source["type"], source["accepted_version"], source["url"]) == ("xds", "v1", ads.address)
    assert fleet[0].metric("config_source_connected") == 1


def test_limits_follow_each_push_within_a_second_on_every_node(
    fleet: list[SidecarProcess], ads: AdsServer
) -> None:
    for version, limit in (("v2", 7), ("v3", 3), ("v4", 9)):
        ads.push([gateway_config(limit)], version)
        took = wait_for(partial(fleet_limit_is, fleet, limit), 1.0)
        assert took < 1.0
        acks = ads.wait_for(partial(answered_by_all, ads, version, fleet))
        assert acks < 1.0
        for ack in ads.answers_to(version):
            assert ack.version_info == version and not ack.HasField("error_detail")
            assert ack.node.id == "envoy-ratelimit"


def test_a_bad_resource_is_nacked_with_a_reason_and_the_old_rules_keep_deciding(
    fleet: list[SidecarProcess], ads: AdsServer
) -> None:
    ads.push([gateway_config(30)], "v5")
    wait_for(partial(fleet_limit_is, fleet, 30), 1.0)
    nacks_before = fleet[0].metric('xds_responses_total{answer="nack"}')
    bad = gateway_config(1)
    bad.descriptors[0].descriptors[0].descriptors[0].rate_limit.unit = rls.UNKNOWN
    ads.push([bad], "v6")
    ads.wait_for(lambda: len(ads.answers_to("v6")) == len(fleet))
    for nack in ads.answers_to("v6"):
        assert nack.version_info == "v5"  # the last accepted
        assert nack.error_detail.code == 3
        assert nack.error_detail.message.startswith(
            f"resource '{GATEWAY_DOMAIN}': "
            "descriptors[0].descriptors[0].descriptors[0].rate_limit.unit: invalid unit 'UNKNOWN'"
        )
    assert fleet[0].metric('xds_responses_total{answer="nack"}') == nacks_before + 1
    address = next(_addresses)
    for node in fleet:  # the v5 rule decides, not the refused one (1 a UNKNOWN unit)
        status = decide(node, address)
        assert (status.code, status.current_limit.requests_per_unit) == (wire.Code.OK, 30)
        assert status.current_limit.unit == wire.Unit.MINUTE
    _, body = get(fleet[1], "/readyz")
    assert "invalid unit" in str(body["config_source"])  # the last error, for operators


def test_the_control_plane_killed_and_restarted(
    fleet: list[SidecarProcess], ads: AdsServer
) -> None:
    ads.push([gateway_config(4)], "v7")
    wait_for(partial(fleet_limit_is, fleet, 4), 1.0)
    before = [node.metric("xds_connect_attempts_total") for node in fleet]
    ads.stop()
    down_s = 3.0
    started = time.monotonic()
    while time.monotonic() - started < down_s:  # about 30 rounds: the fleet keeps answering
        assert [limit_seen(node) for node in fleet] == [4, 4, 4]
        time.sleep(0.1)
    assert all(node.metric("config_source_connected") == 0 for node in fleet)
    attempts = [
        n.metric("xds_connect_attempts_total") - b for n, b in zip(fleet, before, strict=True)
    ]
    print(f"\nreconnect attempts while down {down_s:g} s (0.2 s doubling to 1 s): {attempts}")
    # Delays of at least 0.1, 0.2, 0.4, then 0.5 s: at most 8 attempts in 3 s; and it retries.
    assert all(2 <= n <= 8 for n in attempts), attempts
    ads.push([gateway_config(6)], "v8")
    ads.start()  # the same port
    wait_for(partial(fleet_limit_is, fleet, 6), 3.0)
    resubscribed = [r for r in ads.requests if r.response_nonce == "" and r.version_info == "v7"]
    assert len(resubscribed) >= len(fleet)  # each came back with the last accepted version
    wait_for(lambda: all(node.metric("config_source_connected") == 1 for node in fleet), 2.0)


def test_xds_dump_prints_what_the_control_plane_serves(ads: AdsServer) -> None:
    ads.push([gateway_config(6)], "v9")
    done = run_cli(["xds-dump", ads.address, *NODE])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# version v9: 1 RateLimitConfig resources\n---\n")
    assert f"domain: {GATEWAY_DOMAIN}" in done.stdout
    assert "key: masked_remote_address\n" in done.stdout
    assert "requests_per_unit: 6" in done.stdout
    bad = gateway_config(6)
    bad.descriptors[1].rate_limit.requests_per_unit = 0
    bad.descriptors[1].rate_limit.unlimited = True  # with a unit: refused
    ads.push([bad], "v10")
    refused = run_cli(["xds-dump", ads.address, *NODE])
    assert refused.returncode == 1 and "# version v10" in refused.stdout
    assert "descriptors[1].rate_limit.unit: must not be set when unlimited" in refused.stderr
    unreachable = run_cli(["xds-dump", "127.0.0.1:1", "--timeout-s", "2"])
    assert unreachable.returncode == 1 and "127.0.0.1:1" in unreachable.stderr


def test_counters_of_unchanged_rules_continue_across_a_push(ads: AdsServer) -> None:
    node = SidecarProcess(None, "--config-xds", ads.address, *NODE, *RETRY).wait_ready()
    try:
        ads.push([gateway_config(3)], "c1")
        wait_for(partial(fleet_limit_is, [node], 3), 2.0)
        address = next(_addresses)
        assert [decide(node, address).limit_remaining for _ in range(2)] == [2, 1]
        grown = gateway_config(3)
        grown.descriptors.add(key="extra", rate_limit={"unit": rls.HOUR, "requests_per_unit": 1})
        ads.push([grown], "c2")
        wait_for(lambda: get(node, "/debug/rules")[1]["source"]["accepted_version"] == "c2", 2.0)  # type: ignore[index]
        third, fourth = decide(node, address), decide(node, address)
        assert (third.code, third.limit_remaining) == (wire.Code.OK, 0)  # the count went on
        assert fourth.code == wire.Code.OVER_LIMIT
    finally:
        node.stop()


def test_runtime_overrides_keep_precedence_across_pushes(ads: AdsServer, tmp_path: Path) -> None:
    admin_port, grpc_port, metrics_port = free_ports(3)
    node = SidecarProcess(
        None,
        *("--config-xds", ads.address, *NODE, *RETRY, "--state-dir", str(tmp_path)),
        *("--admin-address", f"127.0.0.1:{admin_port}"),
        env={"RLS_ADMIN_TOKEN": TOKEN},
        ports=(grpc_port, metrics_port),
    ).wait_ready()
    try:
        ads.push([gateway_config(3)], "o1")
        wait_for(partial(fleet_limit_is, [node], 3), 2.0)
        vip = next(_addresses)
        entries = [*GATEWAY_PREFIX, ("remote_address", vip)]
        body = {
            "domain": GATEWAY_DOMAIN,
            "descriptor": [{"key": key, "value": value} for key, value in entries],
            "rate_limit": {"unit": "minute", "requests_per_unit": 50},
        }
        put = urllib.request.Request(
            f"http://127.0.0.1:{admin_port}/v1/overrides",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(put, timeout=5) as reply:
            assert reply.status in (200, 201)
        assert decide(node, vip).current_limit.requests_per_unit == 50
        ads.push([gateway_config(4)], "o2")
        wait_for(partial(fleet_limit_is, [node], 4), 2.0)  # the push applies to everyone else
        assert decide(node, vip).current_limit.requests_per_unit == 50  # the override stays
    finally:
        node.stop()
