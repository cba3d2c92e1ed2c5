"""Issue #3's outage phase: how a server answers while Redis is hung or down.

One request on the idle server (its status and time), then a load run without the up-front OK
probe of `rls_load.run_load`, which a failing server cannot pass; each row says whether the
server kept answering OK, stalled, or answered with errors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from bench.frames import unframe
from bench.loadgen import Driver, Workload
from bench.rls_load import Measurement, RunContext, run_load
from bench.servers import ServerProcess
from ratelimit_sidecar import wire

STALL_S = 1.0  # a single answer slower than this is a stall, even if it is an error
ANSWER_TIMEOUT_S = 10.0  # a single request's deadline: above redis-py's 5 s socket timeout


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as a gRPC client sees it: status (OK or the gRPC code) and time taken."""

    code: str
    seconds: float
    detail: str = ""

    def describe(self) -> str:
        took = f"{self.seconds * 1000:.1f} ms" if self.seconds < 1 else f"{self.seconds:.1f} s"
        return f"{self.code} in {took}"


def first_answer(address: str, frame: bytes) -> Answer:
    """One request on the connected, otherwise idle server (deadline ANSWER_TIMEOUT_S)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=5.0)  # connecting is not timed
        call = channel.unary_unary(
            wire.METHOD_PATH,
            request_serializer=None,
            response_deserializer=wire.RateLimitResponse.FromString,
        )
        started = time.perf_counter()
        try:
            reply = call(unframe(frame), timeout=ANSWER_TIMEOUT_S)
        except grpc.RpcError as exc:
            return Answer(exc.code().name, time.perf_counter() - started, exc.details() or "")
        return Answer(wire.Code.Name(reply.overall_code), time.perf_counter() - started)


def outage_load(
    ctx: RunContext, server: ServerProcess, driver: Driver, workload: Workload
) -> Measurement:
    """A load run without the up-front OK probe, which a failing server cannot pass."""
    return run_load(ctx, server, driver, workload, probe_first=False)


@dataclass(frozen=True, slots=True)
class OutageRow:
    redis: str  # "hung", "down" or "restarted"
    server: str
    first: Answer
    load: Measurement | None  # None: no load run (restarted, or no Node client)

    @property
    def answering(self) -> bool:
        """Answered OK throughout: the single request and every request of the load run."""
        load_ok = self.load is None or (self.load.requests > 0 and self.load.errors == 0)
        return self.first.code == "OK" and load_ok

    @property
    def silent(self) -> bool:
        """The load run got no answer at all, neither OK nor error, in its window."""
        return self.load is not None and self.load.requests + self.load.errors == 0

    @property
    def behaviour(self) -> str:
        """One of "answers OK", "stalls" (slow or no answers) or "errors" (fast ones)."""
        if self.answering:
            return "answers OK"
        return "stalls" if self.silent or self.first.seconds >= STALL_S else "errors"

    def state(self) -> str:
        """The behaviour and what shows it."""
        if self.answering:
            return self.behaviour
        first, load, parts = self.first, self.load, []
        if load is not None and self.silent:
            parts.append(f"no answer within the {load.duration_s:g} s run")
        elif load is not None:
            parts.append(
                f"{load.errors:,} errors, {load.requests:,} OK in the {load.duration_s:g} s run"
            )
        if first.code != "OK":
            parts.append(f"a single request: {first.describe()}")
        return f"{self.behaviour}: {'; '.join(parts)}"


def outage_verdict(rows: Sequence[OutageRow], redis: str) -> tuple[bool | None, str]:
    found = {r.server: r for r in rows if r.redis == redis}
    sidecar, base = found.get("sidecar"), found.get("baseline")
    if sidecar is None or base is None:
        return None, f"Redis {redis}: NOT MEASURED"
    passed = sidecar.answering and not base.answering
    word = "PASS" if passed else "FAIL"
    return passed, f"Redis {redis}: {word}: sidecar {sidecar.state()}; baseline {base.state()}"
