"""A Rate Limit Quota Service client for tests: one stream, reports written, responses queued.

Plays what Envoy's `rate_limit_quota` filter does on the wire: usage reports up, bucket actions
down whenever the server sends them. Responses are read by a task into a queue, so a test can
wait for the next one with a timeout (or check that none comes) without cancelling a read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import grpc

from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3.rlqs_pb2 import (
    RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
)
from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3.rlqs_pb2_grpc import (
    RateLimitQuotaServiceStub,
)

Bucket = Mapping[str, str]
Action = RateLimitQuotaResponse.BucketAction


def reports(domain: str, *usages: tuple[Bucket, int, int]) -> RateLimitQuotaUsageReports:
    """A usage report: (bucket id, allowed, denied) per bucket."""
    message = RateLimitQuotaUsageReports(domain=domain)
    for bucket, allowed, denied in usages:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(bucket)
        usage.num_requests_allowed, usage.num_requests_denied = allowed, denied
    return message


class QuotaStream:
    """One StreamRateLimitQuotas call on `channel`."""

    def __init__(self, channel: grpc.aio.Channel, domain: str) -> None:
        stub: Any = RateLimitQuotaServiceStub(channel)  # type: ignore[no-untyped-call]
        self.call: Any = stub.StreamRateLimitQuotas()
        self.domain = domain
        self.responses: asyncio.Queue[RateLimitQuotaResponse | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                self.responses.put_nowait(response)
        except grpc.aio.AioRpcError:
            pass  # the status is the call's: see `status`
        finally:
            self.responses.put_nowait(None)

    async def report(self, *usages: tuple[Bucket, int, int], domain: str | None = None) -> None:
        await self.call.write(reports(self.domain if domain is None else domain, *usages))

    async def next(self, timeout_s: float = 5.0) -> RateLimitQuotaResponse | None:
        """The next response; None if the stream ended. TimeoutError if none came in time."""
        return await asyncio.wait_for(self.responses.get(), timeout_s)

    async def exchange(
        self, *usages: tuple[Bucket, int, int], timeout_s: float = 5.0
    ) -> dict[tuple[tuple[str, str], ...], Action]:
        """Report, and the next response's actions by bucket id (in key order)."""
        await self.report(*usages)
        response = await self.next(timeout_s)
        assert response is not None, "the stream ended"
        return actions(response)

    async def latest(self, bucket: Bucket, quiet_s: float = 0.5) -> Action | None:
        """The last action for `bucket` among the responses that came, waiting until none has
        come for `quiet_s`; None if there was none for it."""
        found = None
        while True:
            try:
                response = await self.next(quiet_s)
            except TimeoutError:
                return found
            if response is None:
                return found
            found = actions(response).get(bucket_key(bucket), found)

    async def status(self, timeout_s: float = 5.0) -> grpc.StatusCode:
        code: grpc.StatusCode = await asyncio.wait_for(self.call.code(), timeout_s)
        return code

    async def close(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.done_writing()
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def actions(response: RateLimitQuotaResponse) -> dict[tuple[tuple[str, str], ...], Action]:
    return {tuple(sorted(a.bucket_id.bucket.items())): a for a in response.bucket_action}


def bucket_key(bucket: Bucket) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(bucket.items()))
