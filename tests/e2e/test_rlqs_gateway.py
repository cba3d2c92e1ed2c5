"""The sidecar's Rate Limit Quota Service behind a real Envoy 1.40, beside a ShouldRateLimit
gateway; and the Envoy 1.40 behaviour its assignments are built around, pinned.

tests/e2e/rules/gateway.yaml: an API key has 10 requests per 4 s window (1 s spans)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.envoy import RLQS_TEMPLATE, TEMPLATE, EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

pytestmark = pytest.mark.e2e

RULES = Path(__file__).parent / "rules"
MAX, WINDOW_S = 10, 4.0


def statuses(url: str, count: int, headers: dict[str, str]) -> list[int]:
    """`count` requests one after the other; their HTTP statuses."""
    flags = [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]
    command = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", *flags]
    return [
        int(
            subprocess.run([*command, url], capture_output=True, text=True, check=False).stdout or 0
        )
        for _ in range(count)
    ]


def admitted(url: str, count: int, key: str) -> int:
    return statuses(url, count, {"x-api-key": key}).count(200)


def next_window(after_s: float = 0.2) -> None:
    """Sleep until `after_s` into the next window (windows are aligned on the epoch)."""
    time.sleep(WINDOW_S - time.time() % WINDOW_S + after_s)


@dataclass
class Pair:
    rlqs: EnvoyProcess  # rate_limit_quota filter, streaming to its sidecar
    rls: EnvoyProcess  # ratelimit filter, ShouldRateLimit per request


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("rlqs-pair")
    group = ServerGroup(workdir / "redis")
    started: list[SidecarProcess | EnvoyProcess] = []
    try:
        redis = group.standalone()
        gateways = []
        # What an RLQS gateway spends between its reports (5 s, here longer than a window) no
        # other node sees: a fleet sharing short windows with it has its new keys assume an
        # even split (docs/QUIET_KEYS.md), and stays eventual (at the edge a node counts the
        # others' hits from the store's totals, which lack those; docs/RLQS.md).
        for name, template in (("gw-q", RLQS_TEMPLATE), ("gw-r", TEMPLATE)):
            flags: tuple[str, ...] = ("--redis-url", redis.url, "--node-id", name)
            flags += ("--new-keys-even-split", "--default-consistency", "eventual")
            sidecar = SidecarProcess(RULES, *flags)
            started.append(sidecar.wait_ready())
            envoy = EnvoyProcess(workdir, sidecar.port, name, template=template)
            started.append(envoy.wait_ready())
            gateways.append(envoy)
        # The first sidecar counted itself alone at its start; its next heartbeat (10 s while
        # idle) counts both, which its RLQS assignments depend on.
        first = started[0]
        assert isinstance(first, SidecarProcess)
        deadline = time.monotonic() + 15
        while first.metric("live_nodes") < 2:
            assert time.monotonic() < deadline, "the RLQS sidecar never counted two nodes"
            time.sleep(0.2)
        yield Pair(*gateways)
    finally:
        for process in reversed(started):
            process.stop()
        group.stop_all()


def test_an_rlqs_gateway_and_an_rls_gateway_share_one_limit(pair: Pair) -> None:
    next_window()
    first = admitted(pair.rlqs.url, 15, "shared-key")
    time.sleep(1.2)  # a span's sync: the RLS gateway's sidecar learns the RLQS gateway's count
    second = admitted(pair.rls.url, 15, "shared-key")
    assert first >= 1
    assert first + second <= MAX + 1  # within the window, one token of rounding


def test_a_new_window_refills_the_rlqs_gateway(pair: Pair) -> None:
    """The sidecar pushes the new window's bucket at the reset; Envoy builds it full although
    the old one is drained (a blanket rule goes just before it)."""
    next_window()
    first = admitted(pair.rlqs.url, 15, "refill-key")
    assert 1 <= first <= MAX
    next_window(after_s=0.5)
    again = admitted(pair.rlqs.url, 15, "refill-key")
    assert again >= 3  # half the window's 10 with two sidecars, less rounding
