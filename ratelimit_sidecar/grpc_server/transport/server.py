"""The fast gRPC server: grpc.aio.Server's registration calls, its own HTTP/2 connections.

Services register as they do on grpc.aio (`add_generic_rpc_handlers`,
`add_registered_method_handlers`), so health, reflection and RLQS keep their grpc servicers;
`add_fast_unary` adds a method answered inline on wire bytes (ShouldRateLimit). Every bound a
peer could push on the process is in `PortOptions` (docs/TRANSPORT.md has their table).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.transport.connection import ServerConnection
from ratelimit_sidecar.grpc_server.transport.methods import (
    FastAnswer,
    HeadersAnswer,
    Method,
)
from ratelimit_sidecar.grpc_server.transport.options import PortOptions
from ratelimit_sidecar.grpc_server.transport.port import Port

DRAIN_POLL_S = 0.02


class FastServer:
    """Listens on one TCP address; `start`, `stop(grace)` as grpc.aio.Server."""

    def __init__(
        self,
        address: str,
        reuse_port: bool,
        options: PortOptions | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.port_state = Port(options or PortOptions(), tls)
        self._socket = _listening_socket(address, reuse_port)
        self.port: int = self._socket.getsockname()[1]
        self._server: asyncio.Server | None = None

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self.port_state.methods.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, methods: dict[str, Any]) -> None:
        for name, handler in methods.items():
            path = f"/{service}/{name}".encode()
            self.port_state.methods.by_path.setdefault(path, Method(handler=handler))

    def add_fast_unary(self, path: str, answer: FastAnswer) -> None:
        """`answer` turns a request's wire bytes into the response's (or an awaitable of
        them), raising CallError for a status."""
        self.port_state.methods.by_path[path.encode()] = Method(fast=answer)

    def add_fast_unary_with_headers(self, path: str, answer: HeadersAnswer) -> None:
        """As `add_fast_unary`, `answer` given the call's decoded headers first."""
        self.port_state.methods.by_path[path.encode()] = Method(with_headers=answer)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        port = self.port_state
        self._server = await loop.create_server(
            lambda: ServerConnection(port), sock=self._socket, backlog=1024
        )

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, send GOAWAY, give open calls `grace` seconds, then cut the rest."""
        if self._server is not None:
            self._server.close()
        for conn in self.port_state.admission.connections():
            conn.goaway()
        loop = asyncio.get_running_loop()
        until = loop.time() + (grace or 0.0)
        while self.port_state.admission.count and loop.time() < until:
            await asyncio.sleep(DRAIN_POLL_S)
        for conn in self.port_state.admission.connections():
            conn.fail(f.NO_ERROR, "shutting down")
        await asyncio.sleep(0)  # the handlers cancelled above see it before the loop moves on


def _listening_socket(address: str, reuse_port: bool) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    return sock


def accepts(address: str) -> bool:
    """Whether the fast server can listen on `address` (a TCP host:port, not unix:)."""
    _, sep, port = address.rpartition(":")
    return bool(sep) and port.isdigit() and not address.startswith(("unix:", "unix-abstract:"))


__all__: Sequence[str] = ("FastServer", "accepts")
