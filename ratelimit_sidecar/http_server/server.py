"""The HTTP servers: the metrics address (/metrics, /healthz, /readyz, /debug/*) and the admin API.

A deliberately small HTTP/1.1 server on asyncio streams (one request per connection): enough for
Prometheus scrapes, Kubernetes probes, curl and the overrides CLI, with no extra dependency.
Given `routes`, it answers GET by path (the metrics address, read-only). Given `dispatch`, every
request goes to it whole (`Request`: method, path, query, headers, a body of at most `max_body`
bytes sent with Content-Length; the admin API).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("ratelimit_sidecar.http")

MAX_REQUEST_BYTES = 8192
CLIENT_TIMEOUT_S = 5.0  # to send the request head, and again to take the answer
# At the cap, a new connection takes the place of the oldest one still sending its request
# head (an idle or trickling client), so probes get through however many idle clients hold
# the port; with none to evict the new one is closed at once: slow clients cannot pile up.
MAX_CONNECTIONS = 64
STOP_WAITS = 100  # x 10 ms: how long stop() waits for the handlers of aborted connections

Reply = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[dict[str, list[str]]], Reply | Awaitable[Reply]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    503: "Service Unavailable",
}


class Request(NamedTuple):
    """One request as `dispatch` gets it; header names in lower case."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


Dispatch = Callable[[Request], Awaitable[Reply]]


def json_reply(payload: object, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(payload, indent=1).encode() + b"\n"


def text_reply(text: str, status: int = 200) -> Reply:
    return status, "text/plain; charset=utf-8", text.encode()


class HttpApi:
    """Routes GET paths to callables that return (status, content type, body)."""

    def __init__(
        self,
        routes: dict[str, Route] | None = None,
        *,
        dispatch: Dispatch | None = None,
        max_body: int = 0,
        guard: Callable[[dict[str, str]], Reply | None] | None = None,
        observe: Callable[[int], None] | None = None,
        timeout_s: float = CLIENT_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._routes = routes or {}
        self._dispatch = dispatch
        self._max_body = max_body
        self._guard = guard  # sees the headers before the body is read: its reply ends there
        self._observe = observe  # every answer's status (metrics)
        self._server: asyncio.Server | None = None
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._open: dict[asyncio.StreamWriter, None] = {}
        # connections whose request head is not read yet, oldest first
        self._waiting: dict[asyncio.StreamReader, asyncio.StreamWriter] = {}
        self.port = 0

    async def start(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"  # [::]:8080 is every IPv6 (and IPv4) address
        self._server = await asyncio.start_server(self._handle, host, int(port))
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in self._open:  # a client holding a connection would outlive the loop
            writer.transport.abort()
        await self._server.wait_closed()
        for _ in range(STOP_WAITS):  # their handlers see the abort and end
            if not self._open:
                break
            await asyncio.sleep(0.01)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closing = self._server is not None and not self._server.is_serving()
        if closing or (len(self._open) >= self._max_connections and not self._evict_waiting()):
            writer.close()
            return
        self._open[writer] = None
        self._waiting[reader] = writer
        try:
            status, kind, body = await self._answer(reader)
            if writer.is_closing():  # evicted while it sent nothing: no one to answer
                return
            if self._observe is not None:
                self._observe(status)
            writer.write(_encode(status, kind, body))
            await asyncio.wait_for(writer.drain(), self._timeout_s)
        except (TimeoutError, ConnectionError):
            pass  # a client too slow to take its answer, or gone: just close
        finally:
            del self._open[writer]
            self._waiting.pop(reader, None)
            writer.close()

    def _evict_waiting(self) -> bool:
        """Abort the oldest connection that has not sent its request head; False if none."""
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting))
        self._waiting.pop(oldest).transport.abort()
        return True

    async def _answer(self, reader: asyncio.StreamReader) -> Reply:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._timeout_s)
            self._waiting.pop(reader, None)
            if self._dispatch is not None:
                return await self._dispatched(head, reader)
            return await self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return self._error(400, "bad_request", "incomplete or slow request")
        except Exception:  # an endpoint bug must not take the sidecar down
            log.exception("HTTP endpoint failed")
            return self._error(503, "internal", "internal error")

    def _error(self, status: int, code: str, message: str) -> Reply:
        if self._dispatch is not None:
            return json_error(status, code, message)
        return text_reply(message + "\n", status)

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

    async def _dispatched(self, head: bytes, reader: asyncio.StreamReader) -> Reply:
        """Read the body (Content-Length only, at most `max_body`) and hand the request over."""
        assert self._dispatch is not None
        if len(head) > MAX_REQUEST_BYTES:
            return json_error(400, "bad_request", "request head too large")
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, _, rest = request_line.partition(" ")
        url = urlsplit(rest.split(" ", 1)[0])
        headers: dict[str, str] = {}
        for line in lines:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        refused = None if self._guard is None else self._guard(headers)
        if refused is not None:
            return refused
        if "transfer-encoding" in headers:
            return json_error(411, "length_required", "send the body with Content-Length")
        length_text = headers.get("content-length", "0")
        if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 12:
            return json_error(400, "bad_request", "invalid Content-Length")
        length = int(length_text)
        if length > self._max_body:
            return json_error(413, "too_large", f"body over {self._max_body} bytes")
        body = (
            await asyncio.wait_for(reader.readexactly(length), self._timeout_s) if length else b""
        )
        query = parse_qs(url.query)
        return await self._dispatch(Request(method, url.path, query, headers, body))


def json_error(status: int, code: str, message: str) -> Reply:
    """The admin API's error body: {"error": {"code": ..., "message": ...}}."""
    return json_reply({"error": {"code": code, "message": message}}, status)


def _encode(status: int, kind: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
