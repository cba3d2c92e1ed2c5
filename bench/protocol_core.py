"""The gRPC port's protocol core (grpc_server/protocol/) alone against the whole transport
(the core through its asyncio adapter, grpc_server/transport/), per call.

    python -m bench.protocol_core [--rounds N] [--reads N]

Both are fed the same reads as bench/frameloop.py builds them (CALLS_PER_READ unary calls a
read, HEADERS from one HPACK encoder, one DATA frame ending each stream) and answer every call
with the same fixed message: the transport through its asyncio Protocol and a sink transport,
the core through a plain loop doing what the adapter does per read (receive, answer each
UnaryRequest, data_to_send, next_timer). Prints µs per call, the best and the median of the
rounds, and which build of each ran (compiled: a .so module). The figures are in
docs/TRANSPORT.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence

from bench import frameloop
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.grpc_server.protocol import connection
from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.protocol.validation import UNARY, UNKNOWN_METHOD

BODY = b"\n\x07gateway\x12\x0f\n\r\n\x07api_key\x12\x02k1"  # a small ShouldRateLimit request
ANSWER = b"\x08\x01"  # overall_code OK
PATH = wire.METHOD_PATH.encode()


def answer(_request: bytes) -> bytes:
    return ANSWER


def route(path: bytes) -> int:
    return UNARY if path == PATH else UNKNOWN_METHOD


def core_per_call(chunks: Sequence[bytes]) -> float:
    """µs per call of the core driven as an adapter would, after the warm-up reads."""
    core = connection.Connection(Limits(), MessageBudget(1 << 26), route, 0.0)
    core.receive(f.PREFACE + f.settings_frame([]) + f.frame(f.SETTINGS, f.ACK, 0), 0.0)
    core.receive(f.window_update_frame(0, f.MAX_WINDOW - f.DEFAULT_WINDOW), 0.0)
    feed = _adapter(core, answer)
    for chunk in chunks[: frameloop.WARM_UP_READS]:
        feed(chunk)
    return _timed(feed, chunks[frameloop.WARM_UP_READS :])


def _adapter(
    core: connection.Connection, handler: Callable[[bytes], bytes]
) -> Callable[[bytes], int]:
    unary, now = ev.UnaryRequest, time.monotonic

    def feed(chunk: bytes) -> int:
        for event in core.receive(chunk, now()):
            if type(event) is unary:
                core.answer_unary(event.stream_id, handler(event.message))
        written = len(core.data_to_send())
        core.next_timer()
        return written

    return feed


def _timed(feed: Callable[[bytes], int], chunks: Sequence[bytes]) -> float:
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    for chunk in chunks:
        feed(chunk)
    elapsed = time.perf_counter() - started
    gc.unfreeze()
    return elapsed * 1e6 / (frameloop.CALLS_PER_READ * len(chunks))


def build(module: object) -> str:
    return "compiled" if str(getattr(module, "__file__", "")).endswith(".so") else "pure"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=20_000)
    args = parser.parse_args(argv)
    bodies = [BODY] * (args.reads * frameloop.CALLS_PER_READ)
    chunks = frameloop.all_reads(bodies)
    results: dict[str, list[float]] = {"the transport": [], "protocol core": []}
    for _ in range(args.rounds):  # interleaved, so both see the same machine
        results["the transport"].append(frameloop.answered(answer, chunks))
        results["protocol core"].append(core_per_call(chunks))
    print(f"{args.reads * frameloop.CALLS_PER_READ} calls a round, {args.rounds} rounds")
    print(f"protocol core build: {build(connection)}; the transport: pure (not compiled)")
    for name, values in results.items():
        print(f"{name:>20}: best {min(values):.3f} µs/call, median {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
