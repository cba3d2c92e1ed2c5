"""Hosting one RateLimitService servicer for a benchmark: the same grpc.aio + uvloop stack as the
sidecar, with the gRPC health service (the bench waits on it), until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ratelimit_sidecar import wire


async def serve_servicer(name: str, address: str, servicer: Any) -> int:
    server = grpc.aio.server()
    wire.add_RateLimitServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(address) == 0:
        print(f"{name}: cannot listen on {address}", file=sys.stderr)
        return 1
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    return 0


def run_on_uvloop(main: Coroutine[Any, Any, int]) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
