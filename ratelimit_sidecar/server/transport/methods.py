"""What answers a path on the fast transport."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

# A request's wire bytes to the response's, or to an awaitable of them; raises CallError.
FastAnswer = Callable[[bytes], "bytes | Awaitable[bytes]"]


class Method:
    """What answers one path: a `fast` bytes-to-bytes function, or a grpc RpcMethodHandler."""

    __slots__ = ("fast", "handler")

    def __init__(self, fast: FastAnswer | None = None, handler: Any = None) -> None:
        self.fast = fast
        self.handler = handler
