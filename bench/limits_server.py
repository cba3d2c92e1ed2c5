"""The design the sidecar replaces: a rate limit service that asks Redis on every request.

A ShouldRateLimit servicer on the same stack as the sidecar (grpc.aio server, generated
servicer, uvloop, health service) built on the `limits` library's async Redis storage (redis-py):
for each descriptor of a request it makes one Redis call, the fixed window's INCRBY+EXPIRE
script (`limits`' `FixedWindowRateLimiter.hit` is exactly this call compared with the limit; the
count itself is kept here to answer `limit_remaining`, as the reference Go service does). Every
descriptor gets the same limit, far above any reachable rate (like the bench rule), and its own
status; the overall code is OVER_LIMIT if any descriptor is over.

A Redis error answers the RPC with UNAVAILABLE (Envoy would then fail open or closed as
configured). redis-py's defaults are kept on purpose (5 s socket timeouts, 10 retries with
backoff): the benchmark reports how such a service behaves when Redis goes away.
Run as its own process: `python -m bench.limits_server --address H:P --redis-url redis://…`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.errors import StorageError

from bench.grpc_host import run_on_uvloop, serve_servicer
from ratelimit_sidecar import wire

LIMIT = 1_000_000_000  # per second: never reached, every answer is OK (as the bench rule)


def descriptor_key(domain: str, descriptor: wire.RateLimitDescriptor) -> tuple[str, ...]:
    """The identifiers of one descriptor's counter: domain, then `key=value` per entry."""
    return (domain, *(f"{e.key}={e.value}" for e in descriptor.entries))


class LimitsServicer(wire.RateLimitServiceServicer):
    """One `limits` Redis call per descriptor per request; a Redis error is UNAVAILABLE."""

    def __init__(self, storage: RedisStorage, item: RateLimitItem) -> None:
        self.storage = storage
        self.item = item
        self.current_limit = wire.RateLimit(requests_per_unit=item.amount, unit=wire.Unit.SECOND)

    async def ShouldRateLimit(  # the gRPC method name
        self, request: wire.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> wire.RateLimitResponse:
        try:
            statuses = [await self._hit(request.domain, d) for d in request.descriptors]
        except StorageError as exc:
            error = exc.storage_error
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"redis: {type(error).__name__}: {error}"
            )
        over = any(s.code == wire.Code.OVER_LIMIT for s in statuses)
        overall = wire.Code.OVER_LIMIT if over else wire.Code.OK
        return wire.RateLimitResponse(overall_code=overall, statuses=statuses)

    async def _hit(
        self, domain: str, descriptor: wire.RateLimitDescriptor
    ) -> wire.DescriptorStatus:
        key = self.item.key_for(*descriptor_key(domain, descriptor))
        count = await self.storage.incr(key, self.item.get_expiry())
        code = wire.Code.OK if count <= self.item.amount else wire.Code.OVER_LIMIT
        remaining = max(0, self.item.amount - count)
        return wire.DescriptorStatus(
            code=code, current_limit=self.current_limit, limit_remaining=remaining
        )


def open_storage(redis_url: str) -> RedisStorage:
    """`limits`' async Redis storage on redis-py, its errors wrapped as StorageError."""
    return RedisStorage(f"async+{redis_url}", wrap_exceptions=True, implementation="redispy")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limits_server")
    parser.add_argument("--address", required=True, help="host:port to listen on")
    parser.add_argument("--redis-url", required=True, help="redis://host:port/db")
    args = parser.parse_args(argv)
    return run_on_uvloop(
        serve_servicer(
            "limits_server",
            args.address,
            LimitsServicer(open_storage(args.redis_url), RateLimitItemPerSecond(LIMIT)),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
