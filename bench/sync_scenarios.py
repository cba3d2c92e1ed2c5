"""Redis's bill for two kinds of traffic: the sidecars' sync against a per-request replay.

Three real sidecars share one real Redis; a one-minute limit of 100 in six spans. From the first
request (at a window start) until the window has ended and the sync after it has run, Redis's
commands and CPU are counted; then the same requests are replayed as envoyproxy/ratelimit sends
them (one pipelined INCRBY + EXPIRE each) against the flushed Redis, measured over the same
length of time (so both bills hold the later expiries).

* long tail: 4,000 users x 2 requests, each user's two on two different nodes;
* hot: 20 users x 400 requests spread over the nodes (over the limit).

"all commands" (INFO) include those Lua scripts run; what clients sent is counted by a relay in
front of Redis (harness/command_counter.py). Redis's CPU (user + sys) includes its housekeeping:
its rate after the replay is taken off both sides ("net"), and `hz 1` keeps that floor small.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.report import table
from bench.workload import DOMAIN, KEY, request, rules_dir, rules_yaml
from harness.command_counter import CommandCounter
from harness.grpc_client import rls_stub
from harness.redis_servers import ServerProcess
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire

NODES, LIMIT = 3, 100
IDLE_MIN_S, SETTLE_S = 10.0, 1.5
TARGETS = {"long tail": (0.25, 0.25), "hot": (None, 0.10)}  # commands/request, CPU ratio
Request = tuple[int, str]  # (node, user)
Reading = Callable[[], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    requests: list[Request]
    window_s: int = 60
    spans: int = 6


def long_tail(users: int = 4000, window_s: int = 60, spans: int = 6) -> Scenario:
    """Each user's two requests go to two different nodes."""
    first = [(i % NODES, f"t{i}") for i in range(users)]
    second = [((i + 1) % NODES, f"t{i}") for i in range(users)]
    return Scenario("long tail", first + second, window_s, spans)


def hot(users: int = 20, each: int = 400, window_s: int = 60, spans: int = 6) -> Scenario:
    """Round robin over the nodes; `users` prime to NODES spreads each user over all of them."""
    requests = [(n % NODES, f"h{n % users}") for n in range(users * each)]
    return Scenario("hot", requests, window_s, spans)


def reading(client: redis.Redis, relay: CommandCounter) -> dict[str, Any]:
    """Redis's counters in one INFO call, and the commands clients sent through `relay`."""
    info = client.info("stats", "cpu", "commandstats")
    return {
        "at": time.monotonic(),
        "all": int(info["total_commands_processed"]),
        "calls": {k[8:]: v["calls"] for k, v in info.items() if k.startswith("cmdstat_")},
        "cpu_s": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        "sent": relay.commands,
    }


def between(a: dict[str, Any], b: dict[str, Any], idle_cpu_per_s: float) -> dict[str, Any]:
    """What happened from reading `a` to `b`, without the readings' own INFO commands (nobody
    else sends one)."""
    seconds = b["at"] - a["at"]
    calls = {k: n - a["calls"].get(k, 0) for k, n in b["calls"].items()}
    infos = calls.pop("info", 0)
    raw_cpu = b["cpu_s"] - a["cpu_s"]
    return {
        "seconds": seconds,
        "all_commands": b["all"] - a["all"] - infos,
        "client_commands": b["sent"] - a["sent"],  # the INFO goes around the relay
        "by_command": {k: n for k, n in sorted(calls.items()) if n},
        "cpu_ms": raw_cpu * 1000,
        "net_cpu_ms": (raw_cpu - idle_cpu_per_s * seconds) * 1000,
    }


def per_node(requests: list[Request], nodes: int, act: Callable[[int, str], object]) -> None:
    """`act(node, user)` for every request, one thread per node, each node's in order."""

    def node_load(index: int) -> None:
        for node, user in requests:
            if node == index:
                act(node, user)

    threads = [threading.Thread(target=node_load, args=(index,)) for index in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)


def send(addresses: list[str], requests: list[Request]) -> int:
    """Every request to its node; the OK answers."""
    channels = [grpc.insecure_channel(address) for address in addresses]
    stubs, ok = [rls_stub(channel) for channel in channels], list[bool]()

    def decide(node: int, user: str) -> None:
        reply = stubs[node].ShouldRateLimit(request(user), timeout=5)
        ok.append(reply.overall_code == wire.Code.OK)

    per_node(requests, len(stubs), decide)
    for channel in channels:
        channel.close()
    return sum(ok)


def replay_reference(clients: list[redis.Redis], requests: list[Request], window_s: int) -> None:
    """Per request one pipeline INCRBY + EXPIRE on its node's connection, as the reference."""
    window = int(time.time()) // window_s * window_s

    def count(node: int, user: str) -> None:
        key = f"{DOMAIN}_{KEY}_{user}_{window}"
        pipe = clients[node].pipeline(transaction=False)
        pipe.incrby(key, 1)
        pipe.expire(key, window_s)
        pipe.execute()

    per_node(requests, len(clients), count)


@contextmanager
def fleet(workdir: Path, scenario: Scenario, redis_url: str) -> Iterator[list[SidecarProcess]]:
    spread = f"unit_multiplier: {scenario.window_s}, spans: {scenario.spans}"
    rules = rules_dir(workdir, rules_yaml(LIMIT, spread))
    store = ("--redis-url", redis_url)
    nodes = [SidecarProcess(rules, *store, "--node-id", f"n{i}") for i in range(NODES)]
    try:
        yield [node.wait_ready() for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def over_a_window(
    read: Reading, scenario: Scenario, send_all: Callable[[], object], wait_s: float = 0.0
) -> tuple[list[dict[str, Any]], object]:
    """Readings at a window start at least `wait_s` away, once `send_all()` returned, and once
    that window has ended and the sync after it has run; and `send_all()`'s answer."""
    now, window_s = time.time(), scenario.window_s  # to the first window start after `wait_s`
    time.sleep((int((now + wait_s) // window_s) + 1) * window_s - now + 0.02)
    start = read()
    answer = send_all()
    sent = read()
    span_s = window_s / scenario.spans
    time.sleep(window_s + span_s + SETTLE_S - time.time() % window_s)
    return [start, sent, read()], answer


def measure(
    workdir: Path, server: ServerProcess, scenario: Scenario, idle_min_s: float = IDLE_MIN_S
) -> dict[str, Any]:
    """Ours (idle first, then the scenario) and the reference's replay over as long, in one run;
    Redis's housekeeping, learnt after the replay (only expiries left), taken off both sides."""
    requests = scenario.requests
    with server.client() as client, CommandCounter(server.port) as relay:
        client.flushall()
        read = partial(reading, client, relay)
        with fleet(workdir, scenario, relay.url) as nodes:
            time.sleep(SETTLE_S)
            idle_from, addresses = read(), [n.address for n in nodes]
            load = partial(send, addresses, requests)
            ours, admitted = over_a_window(read, scenario, load, idle_min_s)
        client.flushall()
        replayers = [redis.Redis.from_url(relay.url) for _ in range(NODES)]
        for replayer in replayers:
            replayer.ping()  # connected before counting, as a running service is
        replay = partial(replay_reference, replayers, requests, scenario.window_s)
        reference, _ = over_a_window(read, scenario, replay)
        for replayer in replayers:
            replayer.close()
    after_replay = between(reference[1], reference[2], 0.0)  # expiries, housekeeping
    housekeeping = after_replay["cpu_ms"] / 1000 / after_replay["seconds"]
    idle = between(idle_from, ours[0], housekeeping)  # the fleet idle until the window
    return {
        "scenario": scenario.name, "requests": len(requests), "admitted": admitted,
        "redis_idle_cpu_ms_per_s": housekeeping * 1000,
        "idle_commands_per_s": idle["all_commands"] / idle["seconds"],
        "idle_client_commands_per_s": idle["client_commands"] / idle["seconds"],
        "ours": between(ours[0], ours[2], housekeeping),
        "reference": between(reference[0], reference[2], housekeeping),
    }  # fmt: skip


def report(results: list[dict[str, Any]]) -> tuple[list[str], bool]:
    header = (
        "scenario", "cmds/req ours (sent/all)", "reference (sent/all)",
        "Redis CPU ms net (raw) ours", "reference", "ratio", "target",
    )  # fmt: skip
    rows, met = [], True
    for r in results:
        ours, ref, n = r["ours"], r["reference"], r["requests"]
        ratio = ours["net_cpu_ms"] / ref["net_cpu_ms"]
        per_request, cpu_target = TARGETS[r["scenario"]]
        few_commands = per_request is None or ours["all_commands"] / n <= per_request
        met &= ratio <= cpu_target and few_commands
        target = (f"≤{per_request} cmds/req, " if per_request else "") + f"≤{cpu_target}x CPU"
        rows.append([
            r["scenario"],
            f"{ours['client_commands'] / n:.3f} / {ours['all_commands'] / n:.3f}",
            f"{ref['client_commands'] / n:.2f} / {ref['all_commands'] / n:.2f}",
            f"{ours['net_cpu_ms']:.1f} ({ours['cpu_ms']:.0f})",
            f"{ref['net_cpu_ms']:.1f} ({ref['cpu_ms']:.0f})", f"{ratio:.2f}x", target,
        ])  # fmt: skip
    idle = results[0]
    lines = [
        table(header, rows, left=1),
        f"Redis CPU net of its own housekeeping ({idle['redis_idle_cpu_ms_per_s']:.2f} ms/s),"
        " both from the first request (at a window start) to the sync after the window's end",
        f"idle cost of {NODES} sidecars: {idle['idle_commands_per_s']:.1f} Redis commands/s"
        f" ({idle['idle_client_commands_per_s']:.1f} sent by clients)",
    ]
    return lines, met
