"""The sidecar against the design it replaces: a service that calls Redis on every request.

The baseline (`bench.services limits`) makes one `limits` async-Redis call per descriptor per
request, on the sidecar's own stack, as the reference Go service does; the sidecar decides from
memory and syncs to the same Redis in the background. Both on the server CPU, Redis on the load
generators' (in production another host's). An empty handler alongside shows the most any
server on this stack could reach.

1. Redis up: hot-10 with h2load (decides) and rawload (checks every gRPC status), alternating
   rounds. Target: sidecar RPS at least 2x the baseline's (median of the rounds' ratios), p99
   no worse.
2. Redis hung (SIGSTOP), then down (SIGKILL): per server one request on the idle server, then a
   short rawload run counting OK answers and gRPC errors. Target: the sidecar keeps answering OK
   while the baseline errors or stalls.
3. Redis restarted: one request per server shows whether each recovers.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial

import grpc

from bench import compare
from bench.load import runs
from bench.load.clients import Client, H2load, RawLoad
from bench.load.cpu import Pinning
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, fmt, passing, table
from bench.workload import Workload, hot_10, unframe
from harness.grpc_client import rls_stub
from harness.redis_servers import ServerProcess as Redis
from harness.redis_servers import server_group
from ratelimit_sidecar._proto import wire

ROUNDS = 3
WARM_UP_S = 1.5
RETRY_BUDGET_S = 30.0
MAX_KEYS = 10_000
TARGET_RATIO = 2.0
STALL_S = 1.0  # a single answer slower than this is a stall, even if it is an error
ANSWER_TIMEOUT_S = 10.0  # a single request's deadline: above redis-py's 5 s socket timeout


@dataclass(frozen=True, slots=True)
class Outage:
    redis: str  # "hung", "down" or "restarted"
    server: str
    code: str  # the single request's gRPC status, or its overall_code when OK
    seconds: float
    detail: str
    load: Run | None  # None: no load run (restarted)

    @property
    def state(self) -> str:
        """ "answers OK" (the single request and every request of the load run), else "stalls"
        (slow or no answers) or "errors" (fast ones)."""
        load = self.load
        if self.code == "OK" and (load is None or (load.requests > 0 and not load.errors)):
            return "answers OK"
        silent = load is not None and load.requests + load.errors == 0
        return "stalls" if silent or self.seconds >= STALL_S else "errors"


def first_answer(address: str, frame: bytes) -> tuple[str, float, str]:
    """One request on a connected, otherwise idle server: (status, seconds, error detail)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=5.0)  # connecting is not timed
        message, started = wire.RateLimitRequest.FromString(unframe(frame)), time.perf_counter()
        try:
            reply = rls_stub(channel).ShouldRateLimit(message, timeout=ANSWER_TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code().name, time.perf_counter() - started, exc.details() or ""
        return wire.Code.Name(reply.overall_code), time.perf_counter() - started, ""


@contextmanager
def redis_session(options: Options, retry_s: float, rounds: int) -> Iterator[tuple[Bench, Redis]]:
    """A section's bench, and a Redis with every thread on the load generators' CPU (in
    production it runs on another host: a server's core is its own); stopped on leaving."""
    with (
        runs.session(options, retry_s, rounds) as bench,
        server_group(bench.workdir / "redis") as group,
    ):
        yield bench, pin(group.standalone(), bench.pinning)


def pin(redis: Redis, pinning: Pinning) -> Redis:
    if pinning.pinned and redis.proc is not None:  # every thread of the running process
        cpus = ",".join(str(c) for c in sorted(pinning.client_cpus))
        argv = ["taskset", "-a", "-p", "-c", cpus, str(redis.proc.pid)]
        subprocess.run(argv, check=True, capture_output=True)
    return redis


def outage(
    bench: Bench, redis: str, servers: Sequence[ServerProcess], raw: Client | None, work: Workload
) -> list[Outage]:
    """Each server in turn: one request, then (with a client) a short load run, unchecked."""
    found = []
    for server in servers:
        server.resume()
        try:
            code, seconds, detail = first_answer(server.address, work.frames[0])
            load = runs.timed_run(bench, [server], raw, work, check=False)[0] if raw else None
        finally:
            server.pause()
        found.append(Outage(redis, server.name, code, seconds, detail, load))
        print(f"  Redis {redis:<9} {server.name:<8}  {found[-1].state}")
    return found


def measure(bench: Bench, redis: Redis, clients: list[Client]) -> tuple[list[Run], list[Outage]]:
    """Redis up, hung, down, restarted; every server started here is stopped."""
    work, raw = hot_10(), next(c for c in clients if isinstance(c, RawLoad))
    extra = ("--max-keys", str(MAX_KEYS), "--redis-url", redis.url)
    starters = [
        partial(start_service, bench, "limits", "--redis-url", redis.url),
        partial(start_sidecar, bench, *extra),
        partial(start_service, bench, "empty"),
    ]
    warm = partial(runs.warm_up, bench, client=clients[0], workload=work, seconds=WARM_UP_S)
    with runs.started(starters, warm) as servers:
        measured = runs.alternate(bench, servers, clients, work)
        # each server's load run while Redis is hung or down: as long as a round's, unsettled
        sidecar_first, quick = [servers[1], servers[0]], bench.load(bench.shape.duration_s)
        redis.pause()
        try:
            outages = outage(quick, "hung", sidecar_first, raw, work)
        finally:
            redis.resume()
        redis.kill()
        outages += outage(quick, "down", sidecar_first, raw, work)
        redis.start()
        pin(redis, bench.pinning)
        outages += outage(quick, "restarted", sidecar_first, None, work)
        return measured, outages


def judge_outage(outages: Sequence[Outage], redis: str) -> tuple[bool | None, str]:
    found = {o.server: o.state for o in outages if o.redis == redis}
    if "sidecar" not in found or "limits" not in found:
        return None, f"Redis {redis}: NOT MEASURED"
    passed = found["sidecar"] == "answers OK" and found["limits"] != "answers OK"
    states = f"sidecar {found['sidecar']}; limits {found['limits']}"
    return passed, f"Redis {redis}: {passing(passed)}: {states}"


def outage_table(outages: Sequence[Outage]) -> str:
    header = ("Redis", "server", "state", "first request", "OK/s", "errors/s", "p99 ms")
    rows = []
    for o in outages:
        load, rate = o.load, ["-"] * 3
        if load is not None:
            rate = [fmt(load.rps), fmt(load.errors / load.duration_s), fmt(load.latency.p99_ms, 2)]
        took = f"{o.seconds * 1000:.1f} ms" if o.seconds < 1 else f"{o.seconds:.1f} s"
        rows.append([o.redis, o.server, o.state, f"{o.code} in {took}", *rate])
    return table(header, rows, left=4)


LEGEND = """\
empty = an empty handler on the same stack: its ratio to `limits` is the most any server on it
could reach. Redis runs on the load generators' CPU. Redis hung = SIGSTOP, down = SIGKILL:
first request = one request on the idle server; OK/s, errors/s and p99 from a rawload run (every
gRPC status checked) during the outage."""


def run(options: Options) -> Outcome:
    measured, outages = list[Run](), list[Outage]()
    with redis_session(options, RETRY_BUDGET_S, ROUNDS) as (bench, redis):
        if clients := runs.usable(bench, [H2load(), RawLoad()]):
            measured, outages = measure(bench, redis, clients)
    found = [
        compare.compare(measured, server, "limits", "hot-10", client.name, target=target,
                        p99_no_worse=target is not None)
        for client in clients
        for server, target in (("sidecar", TARGET_RATIO if client is clients[0] else None),
                               ("empty", None))
    ]  # fmt: skip
    judged = [judge_outage(outages, redis) for redis in ("hung", "down")]
    lines, document = compare.report(bench, measured, found)
    lines += ["", outage_table(outages), LEGEND]
    lines += [text for _, text in judged]
    document["outages"] = [
        {**asdict(o), "load": o.load and compare.run_json(o.load), "state": o.state}
        for o in outages
    ]
    verdicts = [*compare.verdicts(found), *(passed for passed, _ in judged)]
    return conclude(options, lines, document, verdicts)
