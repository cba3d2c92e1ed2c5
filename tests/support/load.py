"""A bounded, paced gRPC load against several sidecars, recording every answer."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from ratelimit_sidecar import wire
from tests.support.grpc_client import request

ERROR = -1


@dataclass(frozen=True)
class Answer:
    at: float  # wall clock seconds when the request was sent
    node: int
    code: int  # wire.Code value, or ERROR
    latency_s: float


def drive(
    addresses: list[str],
    rates: list[float],
    seconds: float,
    entries: list[tuple[str, str]],
    domain: str = "gateway",
) -> list[Answer]:
    """Send `rates[i]` requests per second to `addresses[i]` for `seconds`; bounded by both."""
    answers: list[Answer] = []
    lock = threading.Lock()
    deadline = time.time() + seconds
    threads = [
        threading.Thread(
            target=_node_load, args=(i, a, r, deadline, entries, domain, answers, lock)
        )
        for i, (a, r) in enumerate(zip(addresses, rates, strict=True))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 30)
    return sorted(answers, key=lambda a: a.at)


def _node_load(
    node: int,
    address: str,
    rate: float,
    deadline: float,
    entries: list[tuple[str, str]],
    domain: str,
    out: list[Answer],
    lock: threading.Lock,
) -> None:
    message = request(domain, entries)
    interval, mine = 1.0 / rate, []
    with grpc.insecure_channel(address) as channel:
        stub = wire.RateLimitServiceStub(channel)
        next_at = time.time()
        while next_at < deadline:
            time.sleep(max(0.0, next_at - time.time()))
            mine.append(_call(stub, message, node))
            next_at += interval
    with lock:
        out.extend(mine)


def _call(stub: wire.RateLimitServiceStub, message: wire.RateLimitRequest, node: int) -> Answer:
    sent, started = time.time(), time.perf_counter()
    try:
        code = stub.ShouldRateLimit(message, timeout=2).overall_code
    except grpc.RpcError:
        code = ERROR
    return Answer(sent, node, code, time.perf_counter() - started)
