"""`make run` (`python -m harness.demo`): three Envoy gateways, each with its own sidecar, sharing
limits through one Redis: two ask ShouldRateLimit, the third uses the Rate Limit Quota Service.

Everything listens on 127.0.0.1 on free ports; Ctrl-C (or SIGTERM) stops it all.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

from harness.envoy import RLQS_TEMPLATE as RLQS
from harness.envoy import TEMPLATE, EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "envoy" / "rules"
WINDOW_S = 10  # the demo key's window (envoy/rules/gateway.yaml)
# Windows start at each multiple of WINDOW_S of the clock: an example started late in one would
# see its second half counted in the next window and read as a limit not held.
# To the millisecond (GNU date): whole seconds started the example up to a second late.
_LEFT_MS = f"$(( {WINDOW_S * 1000} - $(date +%s%3N) % {WINDOW_S * 1000} ))"
AT_WINDOW_START = f"left={_LEFT_MS}; sleep $((left / 1000)).$(printf %03d $((left % 1000)))"


def start(workdir: Path, group: ServerGroup, started: list[SidecarProcess | EnvoyProcess]) -> str:
    """The demo's Redis, sidecars and gateways (appended to `started` as they come up, for the
    caller to stop); returns Redis's URL."""
    redis = group.standalone()
    # gw-a and gw-b ask ShouldRateLimit per request; gw-c enforces the token buckets its
    # sidecar assigns over the Rate Limit Quota Service (RLQS).
    for name, template in (("gw-a", TEMPLATE), ("gw-b", TEMPLATE), ("gw-c", RLQS)):
        sidecar = SidecarProcess(RULES, "--redis-url", redis.url, "--node-id", name)
        started.append(sidecar.wait_ready())
        gateway = EnvoyProcess(workdir, sidecar.port, name, template=template)
        started.append(gateway.wait_ready())
    return redis.url


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rls-demo-") as tmp:
        workdir = Path(tmp)
        group = ServerGroup(workdir / "redis")
        started: list[SidecarProcess | EnvoyProcess] = []
        try:
            redis_url = start(workdir, group, started)
            _explain(redis_url, [p for p in started if isinstance(p, EnvoyProcess)])
            _wait_for_signal()
        finally:
            for process in reversed(started):
                process.stop()
            group.stop_all()
    print("demo stopped; nothing left running")
    return 0


def _explain(redis_url: str, gateways: list[EnvoyProcess]) -> None:
    a, b, c = (gateway.url for gateway in gateways)
    print(
        f"""
ratelimit-sidecar demo is up. Redis: {redis_url}
  gateway A: {a}    gateway B: {b}    (ShouldRateLimit per request)
  gateway C: {c}    (RLQS: Envoy enforces a token bucket the sidecar assigns)

One API key has 10 requests per 10 s across ALL gateways (windows start at each multiple of
10 s of the clock, in 5 spans of 2 s each): A client on one gateway gets all 10; B hears A's
count from Redis and admits what is left (the first line waits for a window to start):
{_indented(first_story(a, b))}

Gateway C counts against the same limit without a call per request: its first request
reports at once, the answer is its share of what is left; Envoy reports the rest every 5 s:
{_indented(rlqs_story(c, a))}

See the 429 with Retry-After, x-ratelimit-* headers and the JSON body:
  curl -si -H 'x-api-key: k1' {b}/

Two limits on /v1/search, across both gateways: a token bucket (a burst of 4, refilled at 1
a second) and a sliding window (20 in any minute); a 429 reports the limit that refused and
the wait until a token is back (one gateway alone first gets half the burst: a new key
assumes every gateway spends alike until the first sync tells it otherwise):
  {_alternate(a, b, "k4", "/v1/search", 3)}

Per-endpoint limit (3 per minute on /v1/orders), allow list and deny list:
  curl -si -H 'x-api-key: k2' {a}/v1/orders
  curl -si -H 'x-api-key: k3' -H 'x-tier: internal' {a}/
  curl -si -H 'x-api-key: banned' {a}/

Load on both gateways, 200/429 per second:
  .venv/bin/python envoy/load.py {a} {b} --key k9 --seconds 10

Ctrl-C stops everything.""",
        flush=True,
    )


def first_story(a: str, b: str) -> list[str]:
    """The first example's commands: 8 requests on A, then 8 on B, in one window."""
    return [AT_WINDOW_START, _burst(a), "sleep 2", _burst(b)]


def rlqs_story(c: str, a: str) -> list[str]:
    """Gateway C's example: 12 requests on C, then 8 with the same key on A, in one window. C's
    Envoy reports within 5 s, its sidecar pushes at the next span end (6 s), and A's sidecar
    reads it at its own span end: at 6 s if it syncs after C's push, else at 8 s."""
    return [AT_WINDOW_START, _burst(c, key="k5", count=12), "sleep 8", _burst(a, key="k5")]


def _indented(commands: list[str]) -> str:
    return "\n".join("  " + command for command in commands)


def _burst(url: str, key: str = "k1", path: str = "/", count: int = 8) -> str:
    curl = f"curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: {key}' {url}{path}"
    return f"for i in $(seq 1 {count}); do {curl}; done; echo"


def _alternate(a: str, b: str, key: str, path: str, rounds: int) -> str:
    """`rounds` requests to each gateway in turn, printing each status."""
    curl = f"curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: {key}'"
    return f"for i in $(seq 1 {rounds}); do {curl} {a}{path}; {curl} {b}{path}; done; echo"


def _wait_for_signal() -> None:
    stop = False

    def handle(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    while not stop:
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
