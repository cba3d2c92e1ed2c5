"""The fast gRPC server: grpc.aio.Server's registration calls, its own HTTP/2 connections.

Services register as they do on grpc.aio (`add_generic_rpc_handlers`,
`add_registered_method_handlers`), so health, reflection and RLQS keep their grpc servicers;
`add_fast_unary` adds a method answered inline on wire bytes (ShouldRateLimit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

import grpc

from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.transport import frames as f
from ratelimit_sidecar.grpc_server.transport.calls import Call
from ratelimit_sidecar.grpc_server.transport.connection import SOFT_HEADER_LIST_BYTES, H2Connection
from ratelimit_sidecar.grpc_server.transport.headers import Decoded
from ratelimit_sidecar.grpc_server.transport.methods import FastAnswer, HeadersAnswer, Method

log = logging.getLogger("ratelimit_sidecar.transport")

DRAIN_POLL_S = 0.02
TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class _Details:
    """The `grpc.HandlerCallDetails` a generic handler looks a method up by."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[()] = ()


class ServerCore:
    """The methods and open connections of one server; starts each call from its headers."""

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self.methods: dict[bytes, Method] = {}
        self.generic: list[Any] = []
        self.connections: set[H2Connection] = set()
        self.max_age: tuple[float, float] | None = None  # (age, grace) in seconds

    def lookup(self, path: bytes) -> Method | None:
        method = self.methods.get(path)
        if method is None and len(self.methods) < 10_000:
            name = path.decode("utf-8", "replace")
            for handler in self.generic:
                found = handler.service(_Details(name))
                if found is not None:
                    method = self.methods[path] = Method(handler=found)
                    break
        return method

    def open_call(self, conn: H2Connection, stream_id: int, decoded: Decoded, end: bool) -> None:
        """Start the call `decoded` asks for, or answer at once why not. What a header block
        asks is worked out once per cached block (`Decoded.plan`)."""
        plan: Plan = decoded.plan or self._plan(decoded.headers)
        decoded.plan = plan
        if plan.refusal:
            conn.out.append(
                f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, plan.refusal)
            )
            if not end:
                conn.out.append(f.rst_stream(stream_id, f.ErrorCode.NO_ERROR))
            conn.refill()
            return
        assert plan.method is not None
        method = plan.method
        if method.with_headers is not None:  # only a traced ShouldRateLimit: not the usual path
            method = Method(fast=partial(method.with_headers, decoded.headers))
        call = Call(conn, stream_id, method, self.max_message_bytes)
        conn.calls[stream_id] = call
        if plan.timeout_s is not None:
            call.deadline = asyncio.get_running_loop().time() + plan.timeout_s
            conn.fresh.append(call)
        if end:
            call.receive(b"", 0, True)

    def _plan(self, headers: list[tuple[bytes, bytes]]) -> Plan:
        fields = dict(headers)
        problem = _http_problem(fields)
        if not problem and sum(len(n) + len(v) + 32 for n, v in headers) > SOFT_HEADER_LIST_BYTES:
            status = grpc.StatusCode.RESOURCE_EXHAUSTED
            message = f"headers over the limit of {SOFT_HEADER_LIST_BYTES} bytes"
            problem = f.grpc_status_block(status.value[0], message, True)
        if problem:
            return Plan(None, None, problem)
        method = self.lookup(fields.get(b":path", b""))
        status = _grpc_problem(fields, method)  # a gRPC call the server does not take
        if status is not None:
            block = f.grpc_status_block(status[0].value[0], status[1], headers_too=True)
            if status[0] is grpc.StatusCode.UNIMPLEMENTED and b"grpc-encoding" in fields:
                block += f.literal(b"grpc-accept-encoding", b"identity")
            return Plan(None, None, block)
        timeout = fields.get(b"grpc-timeout")
        return Plan(method, None if timeout is None else _timeout_s(timeout), b"")


class Plan(NamedTuple):
    """What a request's headers ask: a method (and its timeout), or a `refusal` to answer."""

    method: Method | None
    timeout_s: float | None
    refusal: bytes


def _http_problem(fields: dict[bytes, bytes]) -> bytes:
    """A header block answering a request that is not gRPC at all ("" for gRPC)."""
    if fields.get(b":method") != b"POST":
        return f.http_status_block(405)
    if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
        return f.http_status_block(415)
    return b""


def _grpc_problem(
    fields: dict[bytes, bytes], method: Method | None
) -> tuple[grpc.StatusCode, str] | None:
    if method is None:
        path = fields.get(b":path", b"").decode("utf-8", "replace")
        return grpc.StatusCode.UNIMPLEMENTED, f"unknown method {path}"
    encoding = fields.get(b"grpc-encoding", b"identity")
    if encoding != b"identity":
        name = encoding.decode("ascii", "replace")
        return grpc.StatusCode.UNIMPLEMENTED, (
            f"grpc-encoding {name} is not supported: send messages uncompressed"
        )
    timeout = fields.get(b"grpc-timeout")
    if timeout is not None and _timeout_s(timeout) < 0:
        return grpc.StatusCode.INTERNAL, f"bad grpc-timeout {timeout.decode('ascii', 'replace')}"
    return None


def _timeout_s(value: bytes) -> float:
    """grpc-timeout ("100m": 0.1 s); -1 when malformed."""
    unit = TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return -1.0
    return int(digits) * unit


class FastServer:
    """Listens on one TCP address; `start`, `stop(grace)` as grpc.aio.Server."""

    def __init__(
        self,
        address: str,
        reuse_port: bool,
        max_message_bytes: int,
        tls: ServerTls | None = None,
        max_age: tuple[float, float] | None = None,
    ) -> None:
        self.core = ServerCore(max_message_bytes)
        self.core.max_age = max_age
        self._socket = _listening_socket(address, reuse_port)
        self.port: int = self._socket.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._tls = tls  # TLS on the port (the frames are the same inside it)

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self.core.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, methods: dict[str, Any]) -> None:
        for name, handler in methods.items():
            path = f"/{service}/{name}".encode()
            self.core.methods.setdefault(path, Method(handler=handler))

    def add_fast_unary(self, path: str, answer: FastAnswer) -> None:
        """`answer` turns a request's wire bytes into the response's (or an awaitable of
        them), raising CallError for a status."""
        self.core.methods[path.encode()] = Method(fast=answer)

    def add_fast_unary_with_headers(self, path: str, answer: HeadersAnswer) -> None:
        """As `add_fast_unary`, `answer` given the call's decoded headers first."""
        self.core.methods[path.encode()] = Method(with_headers=answer)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        tls = self._tls
        factory: Callable[[], H2Connection] = lambda: H2Connection(self.core)  # noqa: E731
        if tls is not None and tls.files.client_san is not None:
            factory = lambda: SanCheckedConnection(self.core, tls)  # noqa: E731
        context = None if tls is None else tls.server_context()
        self._server = await loop.create_server(
            factory, sock=self._socket, backlog=1024, ssl=context
        )

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, send GOAWAY, give open calls `grace` seconds, then cut the rest."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.core.connections):
            conn.goaway()
        loop = asyncio.get_running_loop()
        until = loop.time() + (grace or 0.0)
        while self.core.connections and loop.time() < until:
            await asyncio.sleep(DRAIN_POLL_S)
        for conn in list(self.core.connections):
            conn.fail(f.ErrorCode.NO_ERROR, "shutting down")
        await asyncio.sleep(0)  # the handlers cancelled above see it before the loop moves on


class SanCheckedConnection(H2Connection):
    """mTLS with a required subject alternative name: a client certificate without it is
    closed as soon as the handshake is done, before any frame is read."""

    def __init__(self, core: ServerCore, tls: ServerTls) -> None:
        super().__init__(core)
        self._tls = tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._tls.peer_allowed(transport.get_extra_info("peercert")):
            san = self._tls.files.client_san
            log.warning("a TLS client without the required SAN %s: connection closed", san)
            transport.close()
            return
        super().connection_made(transport)


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
