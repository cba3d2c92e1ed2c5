"""An empty RateLimitService on grpc.aio + uvloop: the baseline the sidecar is compared with.

Same stack as the sidecar (grpc.aio server, generated servicer, uvloop, health service), but
ShouldRateLimit returns one prebuilt response shaped like the sidecar's OK answer.
Run as its own process: `python -m bench.empty_server --address 127.0.0.1:PORT`.
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

from ratelimit_sidecar import wire


def fixed_response() -> wire.RateLimitResponse:
    """One OK status with a limit, remaining count and reset: the sidecar's usual answer size."""
    limit = wire.RateLimit(requests_per_unit=1_000_000_000, unit=wire.Unit.SECOND)
    status = wire.DescriptorStatus(
        code=wire.Code.OK, current_limit=limit, limit_remaining=999_999_999
    )
    status.duration_until_reset.FromMilliseconds(500)
    return wire.RateLimitResponse(overall_code=wire.Code.OK, statuses=[status])


class EmptyServicer(wire.RateLimitServiceServicer):
    def __init__(self) -> None:
        self.response = fixed_response()

    async def ShouldRateLimit(  # the gRPC method name
        self,
        request: wire.RateLimitRequest,  # noqa: ARG002 - the servicer signature
        context: grpc.aio.ServicerContext,  # noqa: ARG002
    ) -> wire.RateLimitResponse:
        return self.response


async def serve(address: str) -> int:
    server = grpc.aio.server()
    wire.add_RateLimitServiceServicer_to_server(EmptyServicer(), server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(address) == 0:
        print(f"empty_server: cannot listen on {address}", file=sys.stderr)
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
    parser = argparse.ArgumentParser(prog="python -m bench.empty_server")
    parser.add_argument("--address", required=True, help="host:port to listen on")
    args = parser.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args.address))


if __name__ == "__main__":
    sys.exit(main())
