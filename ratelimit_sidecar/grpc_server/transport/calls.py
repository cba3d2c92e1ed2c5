"""One gRPC call on one HTTP/2 stream: request messages in, response messages and status out.

A call whose method has a `fast` answer (ShouldRateLimit) is answered inline, in the read that
completed its request, when the answer needs no wait; every other call runs grpc's own servicer
(health, reflection, RLQS) in a task, with a `Context` offering the part of grpc.aio's
ServicerContext those servicers use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ratelimit_sidecar.grpc_server.transport import frames as f
from ratelimit_sidecar.grpc_server.transport.context import Context, invoke
from ratelimit_sidecar.grpc_server.transport.frames import ErrorCode
from ratelimit_sidecar.grpc_server.transport.methods import Method
from ratelimit_sidecar.grpc_server.transport.status import CallError

if TYPE_CHECKING:
    from ratelimit_sidecar.grpc_server.transport.connection import H2Connection

log = logging.getLogger("ratelimit_sidecar.transport")

WRITE_HIGH_WATER = 64 * 1024  # a streaming handler's write waits while more is unsent
INBOX_MESSAGES = 4  # request messages read ahead of a streaming handler
HEADERS_FRAME_FLAGS = f.END_HEADERS
TRAILERS_FLAGS = f.END_HEADERS | f.END_STREAM
_HEADER, _OPENING, _CLOSING = f.FRAME_HEADER, f.GRPC_RESPONSE_HEADERS, f.GRPC_OK_TRAILERS


class Call:
    """The server side of one stream; `conn` writes its frames."""

    __slots__ = (
        "body", "conn", "deadline", "done", "drained", "headers_sent", "inbox", "max_bytes",
        "method", "pending", "recv_window", "remote_closed", "request", "send_window",
        "stream_id", "task", "timer", "trailers",
    )  # fmt: skip

    def __init__(self, conn: H2Connection, stream_id: int, method: Method, max_bytes: int) -> None:
        self.conn, self.stream_id, self.method, self.max_bytes = conn, stream_id, method, max_bytes
        self.send_window = conn.peer_initial_window
        self.recv_window = f.DEFAULT_WINDOW
        self.body = bytearray()
        self.request: bytes | None = None
        self.remote_closed = self.done = self.headers_sent = False
        self.pending = bytearray()
        self.trailers: bytes | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None
        self.drained: asyncio.Event | None = None
        streaming = method.handler is not None and method.handler.request_streaming
        self.inbox: asyncio.Queue[tuple[bytes, int] | None] | None = (
            asyncio.Queue() if streaming else None
        )
        if streaming:
            self.task = asyncio.get_running_loop().create_task(self._run())

    # -- input ----------------------------------------------------------------------------

    def receive(self, data: bytes, flow_size: int, end: bool) -> None:
        self.recv_window -= flow_size
        if self.recv_window < 0:
            self.reset(ErrorCode.FLOW_CONTROL_ERROR)
            return
        if end:
            self.remote_closed = True
        if self.done:
            self.conn.consumed(len(data))
        elif data:
            if not self.body and end and _whole_message(data):  # the common unary request
                self._message(data[5:], len(data))
            else:
                self.body += data
                self._split_messages()
        if end:
            if not self.done:
                self._end_of_requests()
        elif not self.done:
            self._grant()

    def _split_messages(self) -> None:
        body = self.body
        while len(body) >= 5 and not self.done:
            if body[0] & 1:
                self.fail(grpc.StatusCode.INTERNAL, "a compressed message without grpc-encoding")
                return
            size = int.from_bytes(body[1:5])
            if size > self.max_bytes:
                self.fail(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"request message of {size} bytes is over the limit of {self.max_bytes}",
                )
                return
            if len(body) < 5 + size:
                return
            message = bytes(body[5 : 5 + size])
            del body[: 5 + size]
            self._message(message, 5 + size)

    def _message(self, message: bytes, size: int) -> None:
        if self.inbox is not None:
            self.inbox.put_nowait((message, size))
        elif self.request is None:
            self.request = message
            self.conn.consumed(size)
        else:
            self.fail(grpc.StatusCode.INTERNAL, "a unary call with more than one request message")

    def _end_of_requests(self) -> None:
        if self.body:
            self.fail(grpc.StatusCode.INTERNAL, "the request ended inside a message")
        elif self.inbox is not None:
            self.inbox.put_nowait(None)
        elif self.request is None:
            self.fail(grpc.StatusCode.INTERNAL, "a unary call without a request message")
        elif self.method.fast is not None:
            self._answer_fast(self.request)
        else:
            self.task = asyncio.get_running_loop().create_task(self._run())

    def _grant(self) -> None:
        """Reopen the stream's window while its reader keeps up (the inbox bounds the rest)."""
        if self.recv_window < f.DEFAULT_WINDOW // 2 and (
            self.inbox is None or self.inbox.qsize() < INBOX_MESSAGES
        ):
            self.conn.out.append(
                f.window_update(self.stream_id, f.DEFAULT_WINDOW - self.recv_window)
            )
            self.recv_window = f.DEFAULT_WINDOW

    # -- handlers ---------------------------------------------------------------------------

    def _answer_fast(self, request: bytes) -> None:
        assert self.method.fast is not None
        try:
            answer = self.method.fast(request)
        except CallError as exc:
            self.fail(exc.code, exc.message)
            return
        if isinstance(answer, bytes):
            self.send_unary(answer)
        else:
            self.task = asyncio.get_running_loop().create_task(self._await_fast(answer))

    async def _await_fast(self, answer: Awaitable[bytes]) -> None:
        try:
            self.send_unary(await answer)
        except CallError as exc:
            self.fail(exc.code, exc.message)
        self.conn.flush()

    async def _run(self) -> None:
        """A grpc servicer method: to completion, then its status in the trailers."""
        handler = self.method.handler
        context = Context(self, handler.response_serializer)
        code, message = grpc.StatusCode.OK, ""
        try:
            await invoke(handler, self._request(handler), context)
            code, message = context.status()
        except CallError as exc:
            code, message = exc.code, exc.message
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("%s failed", handler.unary_unary or handler.stream_stream)
            code, message = grpc.StatusCode.INTERNAL, "internal error; see the sidecar log"
        self.fail(code, message)
        self.conn.flush()

    def _request(self, handler: Any) -> Any:
        parse = handler.request_deserializer or (lambda raw: raw)
        if handler.request_streaming:
            return self._requests(parse)
        try:
            return parse(self.request)
        except Exception as exc:
            raise CallError(grpc.StatusCode.INTERNAL, "cannot parse the request message") from exc

    async def _requests(self, parse: Callable[[bytes], Any]) -> AsyncIterator[Any]:
        assert self.inbox is not None
        while (item := await self.inbox.get()) is not None:
            message, size = item
            self.conn.consumed(size)
            if not self.remote_closed:
                self._grant()
            try:
                request = parse(message)
            except Exception:
                self.fail(grpc.StatusCode.INTERNAL, "cannot parse a request message")
                self.cancel()
                return
            finally:
                self.conn.flush()
            yield request

    # -- output -------------------------------------------------------------------------------

    def send_unary(self, message: bytes) -> None:
        size = len(message) + 5
        conn, stream_id = self.conn, self.stream_id
        if size > conn.send_window or size > self.send_window or size > conn.peer_max_frame:
            self.send_message(message)
            self.fail(grpc.StatusCode.OK, "")
            return
        conn.send_window -= size
        self.send_window -= size
        conn.out.append(
            b"".join(
                (
                    _HEADER.pack(0, len(_OPENING), f.HEADERS, HEADERS_FRAME_FLAGS, stream_id),
                    _OPENING,
                    _HEADER.pack(size >> 16, size & 0xFFFF, f.DATA, 0, stream_id),
                    b"\0",
                    (size - 5).to_bytes(4),
                    message,
                    _HEADER.pack(0, len(_CLOSING), f.HEADERS, TRAILERS_FLAGS, stream_id),
                    _CLOSING,
                )
            )
        )
        self._ended()

    def send_message(self, message: bytes) -> None:
        if self.done:
            return
        if not self.headers_sent:
            self.headers_sent = True
            self.conn.out.append(
                f.frame(f.HEADERS, HEADERS_FRAME_FLAGS, self.stream_id, f.GRPC_RESPONSE_HEADERS)
            )
        self.pending += b"\0" + len(message).to_bytes(4) + message
        self.pump()

    def fail(self, code: grpc.StatusCode, message: str) -> None:
        """End the call with `code` (OK too), after the messages still unsent."""
        if self.done or self.trailers is not None:
            return
        trailers_only = not self.headers_sent
        self.trailers = f.grpc_status_block(code.value[0], message, headers_too=trailers_only)
        self.pump()

    def pump(self) -> None:
        """Send what the flow-control windows let through; the trailers after the last byte."""
        conn, pending = self.conn, self.pending
        while pending:
            size = min(len(pending), conn.send_window, self.send_window, conn.peer_max_frame)
            if size <= 0:
                conn.blocked[self.stream_id] = self
                return
            conn.out.append(f.frame(f.DATA, 0, self.stream_id, bytes(pending[:size])))
            del pending[:size]
            conn.send_window -= size
            self.send_window -= size
        if self.drained is not None:
            self.drained.set()
        if self.trailers is not None and not self.done:
            conn.out.append(f.frame(f.HEADERS, TRAILERS_FLAGS, self.stream_id, self.trailers))
            self._ended()

    def window_update(self, increment: int) -> None:
        self.send_window += increment
        if increment == 0 or self.send_window > f.MAX_WINDOW:
            self.reset(ErrorCode.FLOW_CONTROL_ERROR if increment else ErrorCode.PROTOCOL_ERROR)
        elif self.pending or self.trailers is not None:
            self.pump()

    def flush(self) -> None:
        self.conn.flush()

    def cancelled(self) -> bool:
        return self.done and self.trailers is None

    def peer(self) -> str:
        return f"ipv4:{self.conn.peer}"

    async def wait_drained(self) -> None:
        while len(self.pending) > WRITE_HIGH_WATER and not self.done:
            self.drained = self.drained or asyncio.Event()
            self.drained.clear()
            await self.drained.wait()

    def _ended(self) -> None:
        self.done = True
        self._stop_timer()
        self._release()
        self.conn.ended(self)

    def _release(self) -> None:
        """Request bytes the call will not use go back to the connection's window."""
        unused = len(self.body)
        self.body.clear()
        while self.inbox is not None and not self.inbox.empty():
            item = self.inbox.get_nowait()
            unused += item[1] if item is not None else 0
        if unused:
            self.conn.consumed(unused)

    # -- ends -------------------------------------------------------------------------------

    def arm_deadline(self) -> None:
        if self.deadline is not None and self.timer is None and not self.done:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_at(self.deadline, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self.timer = None
        if not self.done:
            self._cancel_task()
            self.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
            self.conn.flush()

    def reset(self, code: ErrorCode) -> None:
        """A stream error: RST_STREAM with `code`; the call ends unanswered."""
        self.conn.out.append(f.rst_stream(self.stream_id, code))
        self.remote_closed = True  # no RST_STREAM NO_ERROR after this one
        self.cancel()
        self.conn.calls.pop(self.stream_id, None)

    def cancel(self) -> None:
        """The peer reset the stream or the connection ended: stop the handler, send nothing."""
        self.done = True
        self._stop_timer()
        self._cancel_task()
        self._release()

    def _cancel_task(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _whole_message(data: bytes) -> bool:
    return len(data) >= 5 and data[0] == 0 and int.from_bytes(data[1:5]) == len(data) - 5
