"""A stream's reader reads Envoy's reports only as far ahead as the inbox holds (review finding
11): a gateway sending faster than it is answered is held back, not buffered without end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3.rlqs_pb2 import (
    RateLimitQuotaUsageReports,
)
from ratelimit_sidecar.grpc_server import rlqs

REPORTS = 50


async def test_the_reader_waits_while_the_inbox_is_full() -> None:
    pulled = 0

    async def reports() -> AsyncIterator[RateLimitQuotaUsageReports]:
        nonlocal pulled
        for n in range(REPORTS):
            pulled += 1
            yield RateLimitQuotaUsageReports(domain=f"d{n}")

    inbox = rlqs._inbox()
    reader = asyncio.create_task(rlqs._read(reports(), inbox))
    for _ in range(20):  # the reader's turns, with nobody taking from the inbox
        await asyncio.sleep(0)
    assert inbox.qsize() == rlqs.INBOX_REPORTS
    assert pulled <= rlqs.INBOX_REPORTS + 1  # one more, held until there is room

    got = [await asyncio.wait_for(inbox.get(), 5) for _ in range(REPORTS + 1)]
    await asyncio.wait_for(reader, 5)
    assert [r.domain for r in got[:-1]] == [f"d{n}" for n in range(REPORTS)]  # type: ignore[attr-defined]
    assert got[-1] is rlqs._END


async def test_a_cancelled_reader_ends_without_its_end_mark() -> None:
    async def reports() -> AsyncIterator[RateLimitQuotaUsageReports]:
        for _ in range(REPORTS):
            yield RateLimitQuotaUsageReports(domain="d")

    inbox = rlqs._inbox()
    reader = asyncio.create_task(rlqs._read(reports(), inbox))
    await asyncio.sleep(0.01)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    assert reader.cancelled() and inbox.qsize() == rlqs.INBOX_REPORTS
