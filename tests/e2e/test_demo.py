"""`make run`'s examples, run as a new user runs them: the printed commands, pasted into a shell
at any moment of the demo key's 10 s window, tell the story the demo prints.

The first: one API key, 10 requests per 10 s across all gateways; 8 requests on gateway A, then,
two seconds later, 8 on gateway B. A client of one gateway gets its whole limit; B hears A's
count (the store's near notice) before its first request, so the fleet admits exactly 10 of 16.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator

import pytest

from harness import demo
from harness.envoy import EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

pytestmark = pytest.mark.e2e


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


def run_as_printed(commands: list[str]) -> list[list[int]]:
    """The commands in one shell, started at a random moment of the window; each output line's
    HTTP statuses."""
    time.sleep(random.uniform(0, demo.WINDOW_S))
    script = "\n".join(commands)
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return [[int(code) for code in line.split()] for line in done.stdout.splitlines()]


def test_the_first_example_admits_ten_of_sixteen(gateways: list[EnvoyProcess]) -> None:
    a, b = gateways[0].url, gateways[1].url
    on_a, on_b = run_as_printed(demo.first_story(a, b))
    assert (on_a, on_b) == ([200] * 8, [200] * 2 + [429] * 6)


def test_the_rlqs_example_shares_one_limit(gateways: list[EnvoyProcess]) -> None:
    """Gateway C's answers come from its token bucket, A's from the same key's count: together
    they admit at most the key's 10, and A admits what C left."""
    a, c = gateways[0].url, gateways[2].url
    on_c, on_a = run_as_printed(demo.rlqs_story(c, a))
    admitted = on_c.count(200) + on_a.count(200)
    assert on_c.count(200) >= 1 and admitted <= 10, (on_c, on_a)


def test_a_local_client_sees_the_api_key_limit(gateways: list[EnvoyProcess]) -> None:
    """The demo's shadow deny list is a range no local client is in: the headers tell the key's
    own limit (10 per 10 s), not the deny list's 0."""
    done = subprocess.run(
        ["curl", "-si", "--max-time", "5", "-H", "x-api-key: headers", gateways[0].url + "/"],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    limit = next(
        line.split(":", 1)[1].strip()
        for line in done.stdout.splitlines()
        if line.lower().startswith("x-ratelimit-limit:")
    )
    assert limit.startswith("10,") or limit == "10", limit
