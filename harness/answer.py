"""A handler's answer without an event loop, for tests and in-process benchmarks: only a request
with a strict limit needs the loop and the store."""

from __future__ import annotations

from ratelimit_sidecar.service.ratelimit import RateLimitHandler, StoreNeeded


def answer_now(handler: RateLimitHandler, raw: bytes) -> bytes:
    """The encoded response to `raw`; AssertionError if answering it would wait for a store."""
    try:
        return handler.respond_now(raw)
    except StoreNeeded:
        raise AssertionError("a request with a strict limit is answered by `respond`") from None
