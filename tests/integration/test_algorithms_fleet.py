"""Every eventual algorithm in a fleet of three real sidecars on one real Redis: held near the
exact rule over the limit, never refusing under it, enforcing through an outage, losing no count
on SIGTERM, and starting afresh when a reload changes a rule's algorithm."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.exact import (
    EVENTUAL,
    FLUSH_LIMITS,
    admitted_times,
    drive_keys,
    exact_admitted_times,
    exact_reference,
    stored_hits,
    worst_trailing,
)
from harness.grpc_client import request, rls_stub
from harness.load import ERROR, Answer
from harness.redis_servers import ServerGroup, ServerProcess
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_S, SPANS, MAX = 2, 4, 60
WINDOW_MS = WINDOW_S * 1000
SHARES = [0.6, 0.3, 0.1]
# Trailing windows are counted on client send times, the sidecars decide on arrival: a request
# sent just before a span edge and decided just after it may land on either side. Two hits.
EDGE_SLACK = 2
RULE = "  - key: {key}\n    rate_limit: {{{limit}}}\n"
LIMIT = f"unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX}, spans: {SPANS}"
RULES = "domain: gateway\ndescriptors:\n" + "".join(
    RULE.format(key=name, limit=f"{LIMIT}, algorithm: {name}")
    + RULE.format(key=f"flush_{name}", limit=f"{FLUSH_LIMITS[name]}, algorithm: {name}")
    for name in EVENTUAL
)


def start_fleet(rules: Path, redis: ServerProcess) -> list[SidecarProcess]:
    nodes = [
        SidecarProcess(rules, "--redis-url", redis.url, "--node-id", f"n{i}") for i in range(3)
    ]
    try:
        return [node.wait_ready() for node in nodes]
    except AssertionError:
        for node in nodes:
            node.stop()
        raise


def addresses(fleet: list[SidecarProcess]) -> list[str]:
    return [node.address for node in fleet]


def warm_up(fleet: list[SidecarProcess]) -> None:
    """A little traffic for two spans: every node syncs and learns the fleet's size (a fleet
    that has been running, as in production, not three nodes that have never met)."""
    drive_keys(
        addresses(fleet), [10.0] * 3, 2.2 * WINDOW_S / SPANS, dict.fromkeys(EVENTUAL, "warm")
    )
    deadline = time.monotonic() + 5.0  # heartbeats: every span, each second while starting
    while time.monotonic() < deadline and any(n.metric("live_nodes") < len(fleet) for n in fleet):
        time.sleep(0.2)
    assert [node.metric("live_nodes") for node in fleet] == [len(fleet)] * len(fleet)


@pytest.fixture(scope="module")
def redis(module_redis_server: ServerProcess) -> ServerProcess:
    return module_redis_server


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, redis: ServerProcess
) -> Iterator[list[SidecarProcess]]:
    nodes = start_fleet(write_rules(tmp_path_factory.mktemp("rules"), RULES), redis)
    try:
        warm_up(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def start_of_next_window() -> None:
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.02)


@pytest.fixture(scope="module")
def over_limit(fleet: list[SidecarProcess]) -> dict[str, list[Answer]]:
    """Three windows at twice the limit, 60/30/10 %, every algorithm at once."""
    start_of_next_window()
    rates = [2 * MAX / WINDOW_S * share for share in SHARES]
    return drive_keys(addresses(fleet), rates, 3 * WINDOW_S - 0.1, dict.fromkeys(EVENTUAL, "hot"))


@pytest.fixture(scope="module")
def under_limit(fleet: list[SidecarProcess]) -> dict[str, list[Answer]]:
    """A new key at 80 % of the limit, from a window's start, for 2.75 windows."""
    start_of_next_window()
    rates = [0.8 * MAX / WINDOW_S * share for share in SHARES]
    return drive_keys(addresses(fleet), rates, 2.75 * WINDOW_S, dict.fromkeys(EVENTUAL, "calm"))


@pytest.mark.parametrize("algorithm", EVENTUAL)
def test_over_limit_the_fleet_stays_within_a_span_of_the_exact_rule(
    over_limit: dict[str, list[Answer]], algorithm: str
) -> None:
    answers = over_limit[algorithm]
    assert answers and not [a for a in answers if a.code == ERROR]
    exact = exact_reference(algorithm, MAX, WINDOW_MS, SPANS)
    exact_worst = worst_trailing(exact_admitted_times(exact, answers), WINDOW_MS)
    fleet_worst = worst_trailing(admitted_times(answers), WINDOW_MS)
    print(f"{algorithm}: worst trailing window {fleet_worst} vs exact {exact_worst}")
    assert fleet_worst <= exact_worst * (1 + 1 / SPANS) + EDGE_SLACK, (fleet_worst, exact_worst)
    # ... and every node takes its part in holding the fleet back
    assert {a.node for a in answers if a.code == wire.Code.OVER_LIMIT} == {0, 1, 2}


def refused_at_80_percent(answers: list[Answer], settled: bool) -> int:
    """Refusals (and errors) once the key has a finished window and a sync behind it (from
    which every node learns its share), or before that."""
    learnt = answers[0].at + WINDOW_S + WINDOW_S / SPANS
    return sum(a.code != wire.Code.OK and (a.at >= learnt) == settled for a in answers)


@pytest.mark.parametrize("algorithm", EVENTUAL)
def test_at_80_percent_of_the_limit_nothing_is_refused(
    under_limit: dict[str, list[Answer]], algorithm: str
) -> None:
    answers = under_limit[algorithm]
    refused = refused_at_80_percent(answers, settled=True)
    print(f"{algorithm}: at 80 %, {refused} of {len(answers)} refused after the first window")
    assert len(answers) > 2.5 * 0.8 * MAX and refused == 0, (refused, len(answers))


# A new key starts with `nodes` = the fleet's size on every node, so until it learns its share
# (from its first finished window) the 60 % node counts each own hit the store has not
# confirmed for 3. A fixed window's lenient ceiling absorbs that; a sliding window has none,
# and lowers the guess from its first spans only with a margin for their noise (see
# core/sliding_window.py): measured 1 to 2 refusals of the first 60 requests (3 before that
# rule), all on node 0 near the end of the first window. A known transient, bounded here: at
# most 5 % of the first window's requests, none for the others.
FIRST_WINDOW_REFUSALS = {"fixed_window": 0.0, "sliding_window": 0.05, "token_bucket": 0.0}


@pytest.mark.parametrize("algorithm", EVENTUAL)
def test_at_80_percent_a_new_key_is_at_most_briefly_refused_in_its_first_window(
    under_limit: dict[str, list[Answer]], algorithm: str
) -> None:
    answers = under_limit[algorithm]
    refused = refused_at_80_percent(answers, settled=False)
    first = sum(a.at < answers[0].at + WINDOW_S + WINDOW_S / SPANS for a in answers)
    print(f"{algorithm}: at 80 %, {refused} of {first} refused in the new key's first window")
    assert refused <= FIRST_WINDOW_REFUSALS[algorithm] * first, (refused, first)


def test_reload_changing_an_algorithm_starts_a_fresh_counter(
    tmp_path: Path, redis: ServerProcess
) -> None:
    """Three rules change algorithm in a ring, three keep theirs: after the reload the first
    start from a full quota, the others go on counting."""
    ring = dict(zip(EVENTUAL, EVENTUAL[1:] + EVENTUAL[:1], strict=True))
    limit = "unit: hour, requests_per_unit: 10, spans: 4, algorithm: {}"

    def rules(changed: bool) -> str:
        text = "domain: gateway\ndescriptors:\n"
        for name, after in ring.items():
            text += RULE.format(
                key=f"change_{name}", limit=limit.format(after if changed else name)
            )
            text += RULE.format(key=f"keep_{name}", limit=limit.format(name))
        return text

    path = write_rules(tmp_path, rules(False))
    extra = ("--redis-url", redis.url, "--redis-prefix", "reload:", "--reload-poll-s", "0.1")
    node = SidecarProcess(path, *extra).wait_ready()
    try:
        if time.time() % 3600 > 3590:  # a fixed window must not end during the test
            time.sleep(3600 - time.time() % 3600 + 0.1)
        keys = [f"{kind}_{name}" for name in EVENTUAL for kind in ("change", "keep")]
        assert {key: [remaining(node, key) for _ in range(3)][-1] for key in keys} == dict.fromkeys(
            keys, 7
        )
        version = rules_version(node)
        path.write_text(rules(True))
        deadline = time.monotonic() + 5
        while rules_version(node) == version and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rules_version(node) != version
        after = {key: remaining(node, key) for key in keys}
        assert after == {key: 9 if key.startswith("change") else 6 for key in keys}, after
    finally:
        node.stop()


def remaining(node: SidecarProcess, key: str) -> int:
    with grpc.insecure_channel(node.address) as channel:
        reply = rls_stub(channel).ShouldRateLimit(request("gateway", [(key, "v")]), timeout=5)
    assert reply.overall_code == wire.Code.OK
    return int(reply.statuses[0].limit_remaining)


def rules_version(node: SidecarProcess) -> str:
    return str(http_json(node, "/debug/rules")["version"])


def http_json(node: SidecarProcess, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}{path}", timeout=5) as r:
        return dict(json.loads(r.read()))


def test_outage_fallback_enforces_then_sync_resumes_and_sigterm_loses_no_count(
    tmp_path: Path,
) -> None:
    group = ServerGroup(tmp_path / "redis")
    try:
        redis = group.standalone()
        fleet = start_fleet(write_rules(tmp_path, RULES), redis)
        try:
            warm_up(fleet)
            _outage_is_enforced(fleet, redis)
            flushed = _sigterm_during_traffic(fleet)
        finally:
            for node in fleet:
                node.stop()
        for algorithm, admitted in flushed.items():
            with redis.client() as client:
                stored = stored_hits(client, algorithm, ("gateway", f"flush_{algorithm}", "s"))
            print(f"{algorithm}: {admitted} admitted, {stored} in Redis after SIGTERM")
            assert stored == admitted > 100, (algorithm, stored, admitted)
    finally:
        group.stop_all()


def _outage_is_enforced(fleet: list[SidecarProcess], redis: ServerProcess) -> None:
    redis.kill()
    # One whole fixed window: the exact rule's block (a window's cooldown) would otherwise hide
    # the next window's start, where each node alone admits its share again.
    start_of_next_window()
    rates = [2 * MAX / WINDOW_S * share for share in SHARES]
    during = drive_keys(addresses(fleet), rates, WINDOW_S - 0.1, dict.fromkeys(EVENTUAL, "outage"))
    for algorithm, answers in during.items():
        assert answers and not [a for a in answers if a.code == ERROR], algorithm
        # Each node alone, its own hits standing for the fleet's: held to what the exact rule
        # admits of the same arrivals (a fresh token bucket admits them all in this window:
        # its full burst, then its refill), and refusing some.
        exact = len(
            exact_admitted_times(exact_reference(algorithm, MAX, WINDOW_MS, SPANS), answers)
        )
        admitted = sum(a.code == wire.Code.OK for a in answers)
        print(f"{algorithm}: Redis down, {admitted} of {len(answers)} admitted (exact {exact})")
        assert 0 < admitted < len(answers), (algorithm, admitted)
        assert admitted <= exact * (1 + 1 / SPANS) + EDGE_SLACK, (algorithm, admitted, exact)
    assert not any(http_json(node, "/readyz")["store_up"] for node in fleet)
    redis.restart()
    deadline = time.monotonic() + WINDOW_S / SPANS + 2.0  # one span, and the reconnection
    while time.monotonic() < deadline and not all(_store_up(fleet)):
        drive_keys(addresses(fleet), [20.0] * 3, 0.1, dict.fromkeys(EVENTUAL, "wake"))
    assert all(_store_up(fleet))


def _store_up(fleet: list[SidecarProcess]) -> list[bool]:
    return [bool(http_json(node, "/readyz")["store_up"]) for node in fleet]


def _sigterm_during_traffic(fleet: list[SidecarProcess]) -> dict[str, int]:
    """Admitted hits per algorithm, every node stopped (SIGTERM) while the load runs."""
    result: dict[str, list[Answer]] = {}
    values = {f"flush_{n}": "s" for n in EVENTUAL}
    load = threading.Thread(
        target=lambda: result.update(drive_keys(addresses(fleet), [60.0, 40.0, 20.0], 3.0, values))
    )
    load.start()
    time.sleep(1.5)
    codes = [node.stop() for node in fleet]
    load.join(timeout=60)
    assert codes == [0, 0, 0]
    return {name: sum(a.code == wire.Code.OK for a in result[f"flush_{name}"]) for name in EVENTUAL}
