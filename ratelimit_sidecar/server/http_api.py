"""The metrics address: /metrics, /healthz, /readyz, /debug/rules, /debug/keys.

A deliberately small HTTP/1.1 server on asyncio streams (one request per connection): enough for
Prometheus scrapes, Kubernetes probes and curl, with no extra dependency. Read-only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("ratelimit_sidecar.http")

MAX_REQUEST_BYTES = 8192
CLIENT_TIMEOUT_S = 5.0  # to send the request head, and again to take the answer
MAX_CONNECTIONS = 64  # more at once are closed at once: slow clients cannot pile up

Reply = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[dict[str, list[str]]], Reply | Awaitable[Reply]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


def json_reply(payload: object, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(payload, indent=1).encode() + b"\n"


def text_reply(text: str, status: int = 200) -> Reply:
    return status, "text/plain; charset=utf-8", text.encode()


class HttpApi:
    """Routes GET paths to callables that return (status, content type, body)."""

    def __init__(
        self,
        routes: dict[str, Route],
        *,
        timeout_s: float = CLIENT_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._routes = routes
        self._server: asyncio.Server | None = None
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._open = 0
        self.port = 0

    async def start(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._server = await asyncio.start_server(self._handle, host or "127.0.0.1", int(port))
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self._max_connections:
            writer.close()
            return
        self._open += 1
        try:
            status, kind, body = await self._answer(reader)
            writer.write(_encode(status, kind, body))
            await asyncio.wait_for(writer.drain(), self._timeout_s)
        except (TimeoutError, ConnectionError):
            pass  # a client too slow to take its answer, or gone: just close
        finally:
            self._open -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> Reply:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._timeout_s)
            return await self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return text_reply("bad request\n", 400)
        except Exception:  # an endpoint bug must not take the sidecar down
            log.exception("HTTP endpoint failed")
            return text_reply("internal error\n", 503)

    async def _respond(self, head: bytes) -> Reply:
        if len(head) > MAX_REQUEST_BYTES:
            return text_reply("request too large\n", 400)
        method, _, rest = head.decode("latin-1").partition(" ")
        target = rest.split(" ", 1)[0]
        if method not in ("GET", "HEAD"):
            return text_reply("only GET\n", 405)
        url = urlsplit(target)
        route = self._routes.get(url.path)
        if route is None:
            return text_reply("not found\n", 404)
        reply = route(parse_qs(url.query))
        return await reply if isinstance(reply, Awaitable) else reply


def _encode(status: int, kind: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
