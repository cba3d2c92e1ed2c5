"""What answers a path on the fast transport."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

# A request's wire bytes to the response's, or to an awaitable of them; raises CallError.
FastAnswer = Callable[[bytes], "bytes | Awaitable[bytes]"]


# The same, given the call's decoded headers first (a traced ShouldRateLimit reads Envoy's
# trace context in them).
HeadersAnswer = Callable[[list[tuple[bytes, bytes]], bytes], "bytes | Awaitable[bytes]"]


class Method:
    """What answers one path: a `fast` bytes-to-bytes function, or a grpc RpcMethodHandler;
    `with_headers`, a fast answer that needs the call's headers (made per call, then)."""

    __slots__ = ("fast", "handler", "with_headers")

    def __init__(
        self,
        fast: FastAnswer | None = None,
        handler: Any = None,
        with_headers: HeadersAnswer | None = None,
    ) -> None:
        self.fast = fast
        self.handler = handler
        self.with_headers = with_headers
