"""The services the sidecar is compared with, on the sidecar's own stack (grpc.aio server,
generated servicer, uvloop, gRPC health service), each its own process:

    python -m bench.services KIND --address 127.0.0.1:PORT [--redis-url URL]

* empty: one prebuilt OK status whatever the request: the least a service on this stack can do;
* empty-fast: the same bytes on the sidecar's fast transport
  (ratelimit_sidecar/grpc_server/transport/);
* count-fast: empty-fast that also counts each distinct body in a dict: the least per-request
  work of any rate limiter (find the client's counter, add one), with many clients a memory cost;
* empty-4: one OK status per descriptor, as the sidecar answers (behind Envoy, which turns every
  status into x-ratelimit headers, this does the sidecar's share of Envoy's work);
* limits: the design the sidecar replaces: per descriptor one call of the `limits` library's
  async Redis storage (the fixed window's INCRBY+EXPIRE); a Redis error answers UNAVAILABLE.
  redis-py's defaults are kept on purpose (5 s socket timeouts, retries with backoff): the
  bench shows how such a service behaves when Redis goes away;
* rlqs-allow: the Rate Limit Quota Service answering every bucket ALLOW_ALL for an hour: what
  Envoy's rate_limit_quota filter costs with the least a server can say.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2_grpc
from limits import RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.errors import StorageError

from harness.rlqs_server import Action, assignment, blanket
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from ratelimit_sidecar.grpc_server.transport.server import FastServer

LIMIT = 1_000_000_000  # per second: never reached, every answer is OK (as the bench rule)
PREBUILT = 16  # empty-4 builds its answers for 1..16 descriptors once
KINDS = ("empty", "empty-fast", "count-fast", "empty-4", "limits", "rlqs-allow")
FAST_KINDS = ("empty-fast", "count-fast")


def status(count: int) -> wire.DescriptorStatus:
    """The status of a descriptor counted `count` times against LIMIT."""
    return wire.DescriptorStatus(
        code=wire.Code.OK if count <= LIMIT else wire.Code.OVER_LIMIT,
        current_limit=wire.RateLimit(requests_per_unit=LIMIT, unit=wire.Unit.SECOND),
        limit_remaining=max(0, LIMIT - count),
    )


def answer(count: int) -> wire.RateLimitResponse:
    """`count` OK statuses with a limit, remaining count and reset: the sidecar's usual size."""
    ok = status(1)
    ok.duration_until_reset.FromMilliseconds(500)
    return wire.RateLimitResponse(overall_code=wire.Code.OK, statuses=[ok] * count)


class Empty(wire.RateLimitServiceServicer):
    def __init__(self, per_descriptor: bool) -> None:
        self.per_descriptor = per_descriptor
        self.answers = [answer(n) for n in range(PREBUILT + 1)]

    async def ShouldRateLimit(  # the gRPC method name
        self, request: wire.RateLimitRequest, _context: grpc.aio.ServicerContext
    ) -> wire.RateLimitResponse:
        count = len(request.descriptors) if self.per_descriptor else 1
        return self.answers[count] if count <= PREBUILT else answer(count)


class Limits(wire.RateLimitServiceServicer):
    """One `limits` Redis call per descriptor per request; a Redis error is UNAVAILABLE."""

    def __init__(self, redis_url: str) -> None:
        url = f"async+{redis_url}"  # wrap_exceptions: redis-py's errors arrive as StorageError
        self.storage = RedisStorage(url, wrap_exceptions=True, implementation="redispy")
        self.item = RateLimitItemPerSecond(LIMIT)

    async def ShouldRateLimit(  # the gRPC method name
        self, request: wire.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> wire.RateLimitResponse:
        try:
            counts = [await self._incr(request.domain, d) for d in request.descriptors]
        except StorageError as exc:
            why = f"redis: {type(exc.storage_error).__name__}: {exc.storage_error}"
            await context.abort(grpc.StatusCode.UNAVAILABLE, why)
        over = any(n > LIMIT for n in counts)
        return wire.RateLimitResponse(
            overall_code=wire.Code.OVER_LIMIT if over else wire.Code.OK,
            statuses=[status(n) for n in counts],
        )

    async def _incr(self, domain: str, descriptor: wire.RateLimitDescriptor) -> int:
        """The descriptor's fixed-window count after this hit (`limits`' hit, kept as a count
        to answer `limit_remaining`, as the reference Go service does)."""
        key = self.item.key_for(domain, *(f"{e.key}={e.value}" for e in descriptor.entries))
        return int(await self.storage.incr(key, self.item.get_expiry()))


ALLOW_ALL_FOR_AN_HOUR = assignment(blanket("ALLOW_ALL"), 3600)


class AllowAll(rlqs_pb2_grpc.RateLimitQuotaServiceServicer):
    """Every bucket of every usage report: ALLOW_ALL."""

    async def StreamRateLimitQuotas(  # the gRPC method name
        self,
        request_iterator: AsyncIterator[rlqs_pb2.RateLimitQuotaUsageReports],
        _context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rlqs_pb2.RateLimitQuotaResponse]:
        async for reports in request_iterator:
            actions = [
                Action(bucket_id=usage.bucket_id, quota_assignment_action=ALLOW_ALL_FOR_AN_HOUR)
                for usage in reports.bucket_quota_usages
            ]
            yield rlqs_pb2.RateLimitQuotaResponse(bucket_action=actions)


class Counting:
    """count-fast's answer: `prebuilt`, after adding one to the request's count."""

    def __init__(self, prebuilt: bytes) -> None:
        self.prebuilt, self.counts = prebuilt, dict[bytes, int]()

    def __call__(self, request: bytes) -> bytes:
        self.counts[request] = self.counts.get(request, 0) + 1
        return self.prebuilt


def server_of(kind: str, address: str, redis_url: str) -> grpc.aio.Server | FastServer:
    """The server of `kind`, its service added (and the gRPC health service), not started."""
    if kind in FAST_KINDS:
        server: grpc.aio.Server | FastServer = FastServer(address, False)
        prebuilt = answer(1).SerializeToString()
        fast = Counting(prebuilt) if kind == "count-fast" else (lambda _request: prebuilt)
        server.add_fast_unary(wire.METHOD_PATH, fast)
    else:
        server = grpc.aio.server()
        if server.add_insecure_port(address) == 0:
            raise SystemExit(f"cannot listen on {address}")
    if kind == "rlqs-allow":
        rlqs_pb2_grpc.add_RateLimitQuotaServiceServicer_to_server(AllowAll(), server)  # type: ignore[no-untyped-call]
    elif kind not in FAST_KINDS:
        servicer = Limits(redis_url) if kind == "limits" else Empty(kind == "empty-4")
        wire.add_RateLimitServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    return server


async def serve(kind: str, address: str, redis_url: str) -> int:
    """Until SIGTERM or SIGINT (made on the running loop, as the `limits` Redis client must be)."""
    server, stop = server_of(kind, address, redis_url), asyncio.Event()
    await server.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.services")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--address", required=True, help="host:port to listen on")
    parser.add_argument("--redis-url", help="redis://host:port/db (limits only)")
    args = parser.parse_args(argv)
    if args.kind == "limits" and not args.redis_url:
        parser.error("limits needs --redis-url")
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args.kind, args.address, args.redis_url))


if __name__ == "__main__":
    sys.exit(main())
