"""A handler's answer without an event loop, for tests and in-process benchmarks: `respond`
suspends only for a request with a strict limit, which needs the loop and the store."""

from __future__ import annotations

from ratelimit_sidecar.service.ratelimit import RateLimitHandler


def answer_now(handler: RateLimitHandler, raw: bytes) -> bytes:
    """The encoded response to `raw`; AssertionError if answering it would wait for a store."""
    pending = handler.respond(raw)
    try:
        pending.send(None)
    except StopIteration as done:
        answer: bytes = done.value
        return answer
    pending.close()
    raise AssertionError("a request with a strict limit is answered by awaiting `respond`")
