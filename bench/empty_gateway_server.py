"""An empty RateLimitService answering one OK status per descriptor (bench/empty_server.py
always answers one).

Envoy's gateway template sends four descriptors per request, and the sidecar answers four
statuses, which Envoy turns into x-ratelimit headers. This baseline answers the same number,
so Envoy does the same work on both answers and the comparison isolates the decision itself.
Run as its own process: `python -m bench.empty_gateway_server --address 127.0.0.1:PORT`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc

from bench.empty_server import fixed_response
from bench.grpc_host import run_on_uvloop, serve_servicer
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.empty_gateway_server")
    parser.add_argument("--address", required=True, help="host:port to listen on")
    args = parser.parse_args(argv)
    return run_on_uvloop(
        serve_servicer("empty_gateway_server", args.address, PerDescriptorServicer())
    )


if __name__ == "__main__":
    sys.exit(main())
