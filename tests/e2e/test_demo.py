"""`make run`'s first demo, as a new user tries it: one API key, 10 requests per 10 s across
all gateways; 8 requests on gateway A, then, two seconds later, 8 on gateway B. A client of one
gateway gets its whole limit; B hears A's count (the store's near notice) before its first
request, so the fleet admits exactly 10 of the 16."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from harness import demo
from harness.envoy import EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

pytestmark = pytest.mark.e2e

WINDOW_S = 10


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EnvoyProcess]]:
    workdir = tmp_path_factory.mktemp("demo")
    group = ServerGroup(workdir / "redis")
    started: list[SidecarProcess | EnvoyProcess] = []
    try:
        demo.start(workdir, group, started)
        yield [process for process in started if isinstance(process, EnvoyProcess)]
    finally:
        for process in reversed(started):
            process.stop()
        group.stop_all()


def status(url: str, key: str) -> int:
    request = urllib.request.Request(url + "/", headers={"x-api-key": key})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def burst(url: str, key: str) -> list[int]:
    return [status(url, key) for _ in range(8)]


def test_the_first_demo_admits_ten_of_sixteen(gateways: list[EnvoyProcess]) -> None:
    a, b = gateways[0].url, gateways[1].url
    # Start just after a window boundary, so that both bursts fall in one window.
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.1)
    on_a = burst(a, "first-demo")
    time.sleep(2)
    on_b = burst(b, "first-demo")
    assert (on_a, on_b) == ([200] * 8, [200] * 2 + [429] * 6)
