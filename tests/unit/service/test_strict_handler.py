"""Where the handler sends a request with a strict limit: to the StrictDecider (awaited) when a
store is configured, else to the limiter like any other rule (local-only: exact on one node)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck
from tests.unit.service.strict_rules import strict_handler


class UnusedStore:
    """The handler must not reach a store on these paths; it counts the times it was."""

    calls = 0

    async def check(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]:
        self.calls += 1
        raise AssertionError(f"store called with {checks}")


def make(tmp_path: Path, strict: bool, store: UnusedStore | None = None) -> RateLimitHandler:
    checker = (store or UnusedStore()) if strict else None
    return strict_handler(tmp_path, checker, strict_max=2, eventual_max=2, timeout_ms=50)


def raw(key: str) -> bytes:
    return request("d", [(key, "x")]).SerializeToString()


def test_local_only_decides_strict_rules_in_memory_exactly(tmp_path: Path) -> None:
    h = make(tmp_path, strict=False)
    answers = [wire.RateLimitResponse.FromString(answer_now(h, raw("strict"))) for _ in range(3)]
    assert [a.overall_code for a in answers] == [wire.Code.OK] * 2 + [wire.Code.OVER_LIMIT]


def test_with_a_store_only_strict_requests_leave_the_synchronous_path(tmp_path: Path) -> None:
    store = UnusedStore()
    h = make(tmp_path, strict=True, store=store)
    assert isinstance(answer_now(h, raw("eventual")), bytes)  # never suspends
    assert store.calls == 0
    asyncio.run(h.respond(raw("strict")))  # the store fails it: `on_store_failure` answers
    assert store.calls == 1
