"""`make run` (`python -m harness.demo`): two Envoy gateways, each with its own sidecar, sharing
limits through one Redis.

Everything listens on 127.0.0.1 on free ports; Ctrl-C (or SIGTERM) stops it all.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

from harness.envoy import EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "envoy" / "rules"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rls-demo-") as tmp:
        workdir = Path(tmp)
        group = ServerGroup(workdir / "redis")
        started: list[SidecarProcess | EnvoyProcess] = []
        try:
            redis = group.standalone()
            for name in ("gw-a", "gw-b"):
                sidecar = SidecarProcess(RULES, "--redis-url", redis.url, "--node-id", name)
                started.append(sidecar.wait_ready())
                started.append(EnvoyProcess(workdir, sidecar.port, name).wait_ready())
            _explain(redis.url, [p for p in started if isinstance(p, EnvoyProcess)])
            _wait_for_signal()
        finally:
            for process in reversed(started):
                process.stop()
            group.stop_all()
    print("demo stopped; nothing left running")
    return 0


def _explain(redis_url: str, gateways: list[EnvoyProcess]) -> None:
    a, b = gateways[0].url, gateways[1].url
    print(
        f"""
ratelimit-sidecar demo is up. Redis: {redis_url}
  gateway A: {a}    gateway B: {b}

One API key has 10 requests per 10 s across BOTH gateways (5 spans of 2 s each):
  {_burst(a)}
  sleep 2
  {_burst(b)}

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
