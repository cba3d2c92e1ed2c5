"""Three sidecar processes, one Redis, strict rules: exact across nodes, and an outage answered
by `on_store_failure` at once once the circuit breaker is open."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.redis_servers import ServerProcess
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.storage.keys import KeySchema, counter_suffix

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_S, MAX, STRICT_TIMEOUT_MS = 2, 50, 50
THREADS_PER_NODE, MAX_CALLS_PER_THREAD = 3, 4000
RULES = f"""\
domain: gateway
descriptors:
  - key: client
    rate_limit:
      unit: second
      unit_multiplier: {WINDOW_S}
      requests_per_unit: {MAX}
      consistency: strict
      on_store_failure: deny  # a check that times out on a starved machine refuses
  - key: deny
    rate_limit:
      {{unit: second, requests_per_unit: 100000, consistency: strict, on_store_failure: deny}}
  - key: local
    rate_limit:
      {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX}, consistency: strict}}
"""
Answer = tuple[float, int, float]  # sent at (s), code, latency (s)


@pytest.fixture
def redis(own_redis_server: ServerProcess) -> ServerProcess:
    return own_redis_server


@pytest.fixture
def fleet(tmp_path: Path, redis: ServerProcess) -> Iterator[list[SidecarProcess]]:
    rules = write_rules(tmp_path, RULES)
    extra = ("--redis-url", redis.url, "--strict-timeout-ms", str(STRICT_TIMEOUT_MS))
    nodes = [SidecarProcess(rules, *extra, "--node-id", f"n{i}") for i in range(3)]
    try:
        yield [node.wait_ready() for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def hammer(fleet: list[SidecarProcess], value: str, key: str, seconds: float) -> list[Answer]:
    """Unpaced calls from THREADS_PER_NODE threads per node; bounded in time and in count."""
    message = request("gateway", [(key, value)])
    deadline = time.time() + seconds
    out: list[list[Answer]] = []

    def run(address: str, answers: list[Answer]) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = rls_stub(channel)
            for _ in range(MAX_CALLS_PER_THREAD):
                if time.time() >= deadline:
                    return
                sent, started = time.time(), time.perf_counter()
                try:
                    code = stub.ShouldRateLimit(message, timeout=2).overall_code
                except grpc.RpcError:
                    code = -1
                answers.append((sent, code, time.perf_counter() - started))

    threads = []
    for node in fleet:
        for _ in range(THREADS_PER_NODE):
            out.append([])
            threads.append(threading.Thread(target=run, args=(node.address, out[-1])))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 30)
    return sorted(a for answers in out for a in answers)


def window_counters(redis: ServerProcess, key: tuple[str, ...]) -> dict[int, int]:
    schema, base = KeySchema(), counter_suffix(key, "")
    with redis.client() as client:
        names = client.keys(f"{schema.tag(key)}{base}*")
        return {
            int(name.decode()[len(schema.tag(key) + base) :]): int(client.get(name) or 0)
            for name in names
        }


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[int(0.99 * (len(ordered) - 1))]


def metric(node: SidecarProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_three_nodes_admit_exactly_max_per_window(
    fleet: list[SidecarProcess], redis: ServerProcess
) -> None:
    key = ("gateway", "client", "hot")
    counters: dict[int, int] = {}
    done = threading.Event()

    def watch() -> None:  # counters expire after two windows: read them while they live
        while not done.wait(0.2):
            counters.update(window_counters(redis, key))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        answers = hammer(fleet, "hot", "client", 3 * WINDOW_S)
    finally:
        done.set()
        watcher.join(timeout=10)
    counters.update(window_counters(redis, key))
    assert not [a for a in answers if a[1] == -1]
    admitted = sum(a[1] == wire.Code.OK for a in answers)
    # The counters hold exactly what was admitted, per window dated by Redis TIME.
    assert admitted == sum(counters.values()), (admitted, counters)
    assert max(counters.values()) == MAX, counters  # never MAX + 1
    full = [w for w, count in counters.items() if count == MAX]
    assert len(full) >= 2, counters  # the load far exceeds MAX: full windows, not just < MAX
    assert len(answers) > 10 * admitted  # the load was heavy
    latencies = [a[2] for a in answers]
    failed = sum(metric(n, 'ratelimit_sidecar_strict_checks_total{result="failed"}') for n in fleet)
    print(f"strict checks failed (timeout or error, denied): {failed:.0f}")
    p50_ms, p99_ms = sorted(latencies)[len(latencies) // 2] * 1e3, p99(latencies) * 1e3
    print(f"strict answers: n={len(answers)} p50={p50_ms:.2f} ms p99={p99_ms:.2f} ms")


@pytest.mark.parametrize("outage", ["kill", "pause"])
def test_an_outage_is_answered_by_the_policy_within_the_strict_timeout(
    fleet: list[SidecarProcess], redis: ServerProcess, outage: str
) -> None:
    assert {a[1] for a in hammer(fleet, "before", "deny", 0.5)} == {wire.Code.OK}
    (redis.kill if outage == "kill" else redis.pause)()
    try:
        denied = hammer(fleet, "during", "deny", 2.0)
        local = hammer(fleet, "during", "local", 2.0)
    finally:
        if outage == "pause":
            redis.resume()
    assert not [a for a in denied + local if a[1] == -1]
    start = denied[0][0]
    settled = [a for a in denied if a[0] >= start + 0.2]  # the breakers have opened by then
    assert {a[1] for a in settled} == {wire.Code.OVER_LIMIT}  # on_store_failure: deny
    breaker_p99 = p99([a[2] for a in settled])
    assert breaker_p99 < STRICT_TIMEOUT_MS / 1000, breaker_p99
    print(f"{outage}: breaker-open answers n={len(settled)} p99={breaker_p99 * 1e3:.2f} ms")
    # on_store_failure local: each node decides alone with the limit's eventual twin
    admitted = sum(a[1] == wire.Code.OK for a in local)
    assert 0 < admitted <= 3 * MAX * 2, admitted
    for node in fleet:
        if node.proc.poll() is not None:  # pragma: no cover - diagnosis of a crash
            node.stop()
            raise AssertionError(f"sidecar exited {node.proc.returncode}:\n{node.stderr}")
        assert metric(node, 'ratelimit_sidecar_strict_checks_total{result="breaker_open"}') > 0
        assert metric(node, "ratelimit_sidecar_strict_breaker_state") in (1.0, 2.0)
