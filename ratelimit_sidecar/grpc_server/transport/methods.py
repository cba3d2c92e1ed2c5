"""What answers each path of the gRPC port, and the kind of call the protocol core makes of it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit_sidecar.grpc_server.protocol import validation as v

# A request's wire bytes to the response's, or to an awaitable of them; raises CallError.
FastAnswer = Callable[[bytes], "bytes | Awaitable[bytes]"]

# The same, given the call's decoded headers first (a traced ShouldRateLimit reads Envoy's
# trace context in them).
HeadersAnswer = Callable[[list[tuple[bytes, bytes]], bytes], "bytes | Awaitable[bytes]"]

MAX_LOOKED_UP = 10_000  # paths remembered from generic handlers; a scan of made-up paths stops


class Method:
    """What answers one path: a `fast` bytes-to-bytes function, or a grpc RpcMethodHandler;
    `with_headers`, a fast answer that needs the call's headers."""

    __slots__ = ("fast", "handler", "kind", "with_headers")

    def __init__(
        self,
        fast: FastAnswer | None = None,
        handler: Any = None,
        with_headers: HeadersAnswer | None = None,
    ) -> None:
        self.fast = fast
        self.handler = handler
        self.with_headers = with_headers
        streaming = handler is not None and handler.request_streaming
        self.kind = v.STREAMING if streaming else v.UNARY


class _Details:
    """The `grpc.HandlerCallDetails` a generic handler looks a method up by."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[()] = ()


class Methods:
    """The port's methods by path: registered ones, then grpc's generic handlers (health,
    reflection), whose answers are remembered."""

    def __init__(self) -> None:
        self.by_path: dict[bytes, Method] = {}
        self.generic: list[Any] = []

    def lookup(self, path: bytes) -> Method | None:
        method = self.by_path.get(path)
        if method is None and len(self.by_path) < MAX_LOOKED_UP:
            name = path.decode("utf-8", "replace")
            for handler in self.generic:
                found = handler.service(_Details(name))
                if found is not None:
                    method = self.by_path[path] = Method(handler=found)
                    break
        return method

    def route(self, path: bytes) -> int:
        """The protocol core's `Route`: the kind of call a path makes."""
        method = self.lookup(path)
        return v.UNKNOWN_METHOD if method is None else method.kind
