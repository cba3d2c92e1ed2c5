"""An empty RateLimitService on grpc.aio + uvloop: the baseline the sidecar is compared with.

Same stack as the sidecar (grpc.aio server, generated servicer, uvloop, health service), but
ShouldRateLimit returns one prebuilt response shaped like the sidecar's OK answer.
Run as its own process: `python -m bench.empty_server --address 127.0.0.1:PORT`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc

from bench.grpc_host import run_on_uvloop, serve_servicer
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.empty_server")
    parser.add_argument("--address", required=True, help="host:port to listen on")
    args = parser.parse_args(argv)
    return run_on_uvloop(serve_servicer("empty_server", args.address, EmptyServicer()))


if __name__ == "__main__":
    sys.exit(main())
