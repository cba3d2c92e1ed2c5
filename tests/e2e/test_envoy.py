"""Envoy's ratelimit filter in front of real sidecars: what a client of the gateway sees."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from tests.e2e.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.e2e


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def get(url: str, **headers: str) -> Reply:
    names = {k.replace("_", "-"): v for k, v in headers.items()}
    request = urllib.request.Request(url, headers=names)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return Reply(
                reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
            )
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def wait_for_window_start(window_s: int) -> None:
    """Sleep to just after the next epoch multiple of the window, so a test stays in one window."""
    time.sleep(window_s - time.time() % window_s + 0.05)


def test_one_limit_is_shared_across_two_gateways(shared_pair: list[Gateway]) -> None:
    a, b = shared_pair
    wait_for_window_start(4)
    statuses: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(12):  # 24 requests in ~3 s against a limit of 10 per 4 s, split evenly
        statuses["a"].append(get(a.url, x_api_key="shared").status)
        statuses["b"].append(get(b.url, x_api_key="shared").status)
        time.sleep(0.25)
    admitted = sum(s.count(200) for s in statuses.values())
    # MAX × (1 + 1/N) with N = 4 spans is 12.5: the algorithm's stated bound for one window.
    assert 8 <= admitted <= 12, statuses
    assert 429 in statuses["a"] and 429 in statuses["b"], statuses


def test_over_limit_reply_has_retry_after_headers_and_json_body(single: Gateway) -> None:
    replies = [get(single.url + "/counted", x_api_key="hdr") for _ in range(4)]
    assert [r.status for r in replies] == [200, 200, 200, 429]
    ok, over = replies[0], replies[-1]
    # the tightest limit first, then every policy; the 4 s window uses unit_multiplier
    assert ok.headers["x-ratelimit-limit"] == '3, 10;w=4, 3;w=3600;name="counted"'
    assert ok.headers["x-ratelimit-remaining"] == "2"
    assert 0 < int(ok.headers["x-ratelimit-reset"]) <= 3600
    assert over.headers["x-ratelimit-remaining"] == "0"
    assert int(over.headers["retry-after"]) >= 1
    assert over.headers["content-type"] == "application/json"
    error = json.loads(over.body)["error"]
    assert error["code"] == "RATE_LIMITED"
    assert (error["limit"], error["window"], error["name"]) == (3, 3600, "counted")
    assert error["retry_after"] == int(over.headers["retry-after"])


def test_x_ratelimit_reset_counts_whole_seconds_like_retry_after(single: Gateway) -> None:
    """Envoy builds x-ratelimit-reset from the seconds of duration_until_reset alone: a reset
    of 0.9 s must read 1, not 0, on a 429 beside `retry-after: 1`."""
    wait_for_window_start(1)
    ok, over = (get(single.url, x_api_key="per-second") for _ in range(2))
    assert (ok.status, over.status) == (200, 429)
    assert ok.headers["x-ratelimit-reset"] == "1"
    assert over.headers["x-ratelimit-reset"] == over.headers["retry-after"] == "1"
    assert over.headers["x-ratelimit-remaining"] == "0"
    wait_for_window_start(1)  # cooldown: window_end: admitted again at the next second
    assert get(single.url, x_api_key="per-second").status == 200


def test_envoys_default_hits_addend_counts_as_one(single: Gateway) -> None:
    remaining = [get(single.url + "/counted", x_api_key="one").headers["x-ratelimit-remaining"]]
    remaining.append(get(single.url + "/counted", x_api_key="one").headers["x-ratelimit-remaining"])
    assert remaining == ["2", "1"]


def test_unlimited_deny_and_shadow_rules(single: Gateway) -> None:
    internal = [get(single.url, x_api_key="vip", x_tier="internal").status for _ in range(3)]
    assert internal == [200] * 3
    assert get(single.url, x_api_key="banned").status == 429
    shadowed = [get(single.url, x_api_key="shadowed") for _ in range(5)]
    assert [r.status for r in shadowed] == [200] * 5  # 1 per hour, but shadow mode admits
    # reported as the reference reports it: its limit, what remains (none), when it resets
    assert {r.headers["x-ratelimit-limit"].split(",")[0] for r in shadowed} == {"1"}
    assert [r.headers["x-ratelimit-remaining"] for r in shadowed] == ["0"] * 5
    # ... when it would admit again: a window over its limit re-arms the (shadow) block of one
    # hour at every span end up to its last span (6 spans: 50 min), so at most 50 + 60 min.
    assert 0 < int(shadowed[-1].headers["x-ratelimit-reset"]) <= 3000 + 3600


def test_ietf_headers_pass_through_envoy(single: Gateway) -> None:
    reply = get(single.url + "/counted", x_api_key="ietf")
    assert reply.headers["ratelimit-policy"] == '"counted";q=3;w=3600'
    assert reply.headers["ratelimit"].startswith('"counted";r=2;t=')


def test_envoy_fails_open_when_the_sidecar_is_gone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    gateway = start_gateway(tmp_path_factory.mktemp("failopen"), "failopen")
    try:
        assert get(gateway.url, x_api_key="banned").status == 429  # the sidecar is consulted
        gateway.sidecar.stop()
        statuses = [get(gateway.url, x_api_key="banned").status for _ in range(3)]
        assert statuses == [200] * 3  # failure_mode_deny: false
        # Envoy counts rate limit outcomes on the route's target cluster
        assert gateway.envoy.stat("cluster.backend.ratelimit.failure_mode_allowed") == 3
    finally:
        stop_gateway(gateway)
