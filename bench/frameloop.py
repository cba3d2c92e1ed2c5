"""The request path in one process, without sockets: the handler cut after each of its stages,
and the fast transport's frame loop (one HTTP/2 connection fed reads of gRPC calls as h2load
sends them: HEADERS from one HPACK encoder, then one DATA frame that ends the stream; its answers
written to a sink). What bench/instructions.py counts and `bench overhead` times per call."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hpack

from harness import h2frames as f
from harness.h2raw import grpc_message
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.grpc_server.transport.connection import ServerConnection
from ratelimit_sidecar.grpc_server.transport.methods import Method
from ratelimit_sidecar.grpc_server.transport.options import PortOptions
from ratelimit_sidecar.grpc_server.transport.port import Port

WARM_UP_READS = 100  # the HPACK block cache and the handler's compiled requests fill up
CALLS_PER_READ = 8  # as the load generators keep in flight per connection
HEADERS = [
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", wire.METHOD_PATH.encode()),
    (b":authority", b"127.0.0.1"), (b"te", b"trailers"), (b"content-type", b"application/grpc"),
    (b"grpc-timeout", b"20S"),
]  # fmt: skip


def stages(decider: Any) -> dict[str, Callable[[bytes], Any]]:
    """The hot path cut after each stage (cumulative): `lookup` finds the compiled request,
    `decision` adds the clock and the fast path's decision (service/fast_path.py), `encoding`
    the answer's bytes (the bare decision: what any implementation of the API does per call),
    `handler` the metrics' counters (the handler's whole answer); `call` is one Python call,
    whose cost the others include."""
    from ratelimit_sidecar.service.fast_path import admitted_answer, decide_one

    get, limiter, encoder = decider._compiled.get, decider.limiter, decider._encoder
    now = decider._clock_ms

    def decision(body: bytes) -> Any:
        return decide_one(limiter, now(), get(body))

    def encoding(body: bytes) -> bytes:
        one = get(body)
        return admitted_answer(encoder, one, decide_one(limiter, now(), one))

    return {
        "call": lambda body: body,
        "lookup": lambda body: get(body),  # noqa: PLW0108 - one Python call, as the others
        "decision": decision,
        "encoding": encoding,
        "handler": decider.respond_now,
    }


class Sink(asyncio.Transport):
    """Takes the connection's writes and drops them."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def reads(bodies: Sequence[bytes], count: int, calls: int) -> list[bytes]:
    """`count` reads of `calls` calls each, cycling through `bodies`."""
    encoder, stream, out = hpack.Encoder(), 1, []
    for index in range(count):
        frames = []
        for body in (bodies[(index * calls + i) % len(bodies)] for i in range(calls)):
            block = encoder.encode(HEADERS)
            frames.append(f.frame(f.HEADERS, f.END_HEADERS, stream, block))
            frames.append(f.frame(f.DATA, f.END_STREAM, stream, grpc_message(body)))
            stream += 2
        out.append(b"".join(frames))
    return out


def frame_loop(answer: Callable[[bytes], Any], bodies: Sequence[bytes]) -> float:
    """Every body answered through one connection, CALLS_PER_READ per read; the reads after
    the warm-up run in `deque(map(...))`, the loop bench/instructions.py counts in."""
    return answered(answer, all_reads(bodies))


def all_reads(bodies: Sequence[bytes]) -> list[bytes]:
    """WARM_UP_READS reads, then reads of every body: what `answered` feeds a connection."""
    return reads(bodies, WARM_UP_READS + len(bodies) // CALLS_PER_READ, CALLS_PER_READ)


def answered(answer: Callable[[bytes], Any], chunks: Sequence[bytes]) -> float:
    """`chunks` (from `all_reads`) fed to a new connection answering with `answer`: µs per
    call of the reads after the first WARM_UP_READS."""

    async def run() -> float:
        port = Port(PortOptions(), None)
        port.methods.by_path[wire.METHOD_PATH.encode()] = Method(fast=answer)
        conn, sink = ServerConnection(port), Sink()
        conn.connection_made(sink)
        room = f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW)  # for every answer
        conn.data_received(f.PREFACE + f.settings({}) + room + f.settings_ack())
        for chunk in chunks[:WARM_UP_READS]:
            conn.data_received(chunk)
        thawed = gc.get_freeze_count() == 0  # else a server in this process froze first
        gc.collect()
        gc.freeze()  # as the server does after start-up
        started = time.perf_counter()
        deque(map(conn.data_received, chunks[WARM_UP_READS:]), maxlen=0)
        elapsed = time.perf_counter() - started
        if thawed:  # unfreezing another's objects would free its garbage here, warnings and all
            gc.unfreeze()
        if conn.closed or conn.calls:
            raise SystemExit(f"the connection closed or left {len(conn.calls)} calls open")
        return elapsed * 1e6 / (CALLS_PER_READ * (len(chunks) - WARM_UP_READS))

    return asyncio.run(run())
