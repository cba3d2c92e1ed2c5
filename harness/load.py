"""A bounded, paced gRPC load against several sidecars, recording every answer."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc

from harness.grpc_client import request, rls_stub
from ratelimit_sidecar._proto import wire

ERROR = -1


@dataclass(frozen=True)
class Answer:
    at: float  # wall clock seconds when the request was sent
    node: int
    code: int  # wire.Code value, or ERROR
    latency_s: float
    reset_s: int = 0  # the longest duration_until_reset among the statuses (whole seconds)


@dataclass(frozen=True)
class _Node:
    index: int
    address: str
    rate: float  # requests per second
    jitter: float = 0.0


def drive(
    addresses: list[str],
    rates: list[float],
    seconds: float,
    entries: list[tuple[str, str]],
    domain: str = "gateway",
    *,
    jitter: float = 0.0,
) -> list[Answer]:
    """Send `rates[i]` requests per second to `addresses[i]` for `seconds`; bounded by both.
    `jitter` (0 to 1) spreads each gap uniformly over (1 ± jitter) × 1/rate, so a node's hits
    do not keep one phase against the sync loop's span ends."""
    message = request(domain, entries)
    deadline = time.time() + seconds
    nodes = [_Node(i, a, r, jitter) for i, (a, r) in enumerate(zip(addresses, rates, strict=True))]
    per_node: list[list[Answer]] = [[] for _ in nodes]
    threads = [
        threading.Thread(target=_node_load, args=(node, deadline, message, per_node[node.index]))
        for node in nodes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 30)
    return sorted((a for answers in per_node for a in answers), key=lambda a: a.at)


def _node_load(
    node: _Node, deadline: float, message: wire.RateLimitRequest, out: list[Answer]
) -> None:
    """Paced calls to one node until `deadline`; its answers appended to `out`."""
    interval, gaps = 1.0 / node.rate, random.Random(node.index)
    with grpc.insecure_channel(node.address) as channel:
        stub = rls_stub(channel)
        next_at = time.time()
        while next_at < deadline:
            time.sleep(max(0.0, next_at - time.time()))
            out.append(_call(stub, message, node.index))
            next_at += interval * (1 + node.jitter * gaps.uniform(-1.0, 1.0))


def _call(stub: Any, message: wire.RateLimitRequest, node: int) -> Answer:
    sent, started = time.time(), time.perf_counter()
    try:
        reply = stub.ShouldRateLimit(message, timeout=2)
    except grpc.RpcError:
        return Answer(sent, node, ERROR, time.perf_counter() - started)
    reset = max((s.duration_until_reset.seconds for s in reply.statuses), default=0)
    return Answer(sent, node, reply.overall_code, time.perf_counter() - started, reset)
