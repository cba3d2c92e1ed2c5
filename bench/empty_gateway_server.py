"""An empty RateLimitService answering one OK status per descriptor (bench/empty_server.py
always answers one).

Envoy's gateway template sends four descriptors per request, and the sidecar answers four
statuses, which Envoy turns into x-ratelimit headers. This baseline answers the same number,
so Envoy does the same work on both answers and the comparison isolates the decision itself.
Run as its own process: `python -m bench.empty_gateway_server --address 127.0.0.1:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bench.empty_server import fixed_response
from ratelimit_sidecar import wire

PREBUILT = 16  # answers for 1..16 descriptors are built once


def response_for(count: int) -> wire.RateLimitResponse:
    status = fixed_response().statuses[0]
    response = wire.RateLimitResponse(overall_code=wire.Code.OK)
    response.statuses.extend([status] * count)
    return response


class PerDescriptorServicer(wire.RateLimitServiceServicer):
    def __init__(self) -> None:
        self.responses = [response_for(n) for n in range(PREBUILT + 1)]

    async def ShouldRateLimit(  # the gRPC method name
        self,
        request: wire.RateLimitRequest,
        context: grpc.aio.ServicerContext,  # noqa: ARG002 - the servicer signature
    ) -> wire.RateLimitResponse:
        count = len(request.descriptors)
        return self.responses[count] if count <= PREBUILT else response_for(count)


async def serve(address: str) -> int:
    server = grpc.aio.server()
    wire.add_RateLimitServiceServicer_to_server(PerDescriptorServicer(), server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(address) == 0:
        print(f"empty_gateway_server: cannot listen on {address}", file=sys.stderr)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.empty_gateway_server")
    parser.add_argument("--address", required=True, help="host:port to listen on")
    args = parser.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args.address))


if __name__ == "__main__":
    sys.exit(main())
