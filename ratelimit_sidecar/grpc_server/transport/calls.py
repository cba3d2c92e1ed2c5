"""The calls of one connection that run in a task: grpc servicers (health, reflection, RLQS) and a
fast answer that must wait (a strict rule awaiting Redis).

A fast answer that needs no wait (the usual ShouldRateLimit) never becomes a Call: the
connection answers it inline. Each Call has exactly one task, started once (the protocol core
gives each stream one UnaryRequest or RequestStarted), and cancelled when the core says the
stream is over (StreamReset) or the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.transport.context import Context, invoke
from ratelimit_sidecar.grpc_server.transport.status import CallError

log = logging.getLogger("ratelimit_sidecar.transport")

WRITE_HIGH_WATER = 64 * 1024  # a streaming handler's write waits while more is unsent


class CallHost(Protocol):
    """What a call needs of its connection (connection.py)."""

    peer: str

    def flush(self) -> None: ...

    def call_done(self, stream_id: int) -> None: ...


class Call:
    """One call with a handler task; its frames go through the connection's protocol core."""

    __slots__ = (
        "answered", "conn", "core", "deadline", "drained", "ended", "inbox", "stream_id", "task",
    )  # fmt: skip

    def __init__(
        self, conn: CallHost, core: Connection, stream_id: int, deadline: float | None
    ) -> None:
        self.conn, self.core, self.stream_id, self.deadline = conn, core, stream_id, deadline
        self.task: asyncio.Task[None] | None = None
        self.inbox: asyncio.Queue[bytes | None] | None = None
        self.drained: asyncio.Event | None = None
        self.ended = self.answered = False

    # -- starting: once per call ----------------------------------------------------------

    def run_handler(self, handler: Any, message: bytes | None) -> None:
        """A grpc servicer method; `message` is a unary call's request, None when streaming."""
        if message is None:
            self.inbox = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run(handler, message))

    def await_answer(self, answer: Awaitable[bytes]) -> None:
        self.task = asyncio.get_running_loop().create_task(self._answer_when_ready(answer))

    # -- the protocol core's events -------------------------------------------------------

    def deliver(self, message: bytes | None) -> None:
        """A streaming call's next request message; None after the last."""
        if self.inbox is not None:
            self.inbox.put_nowait(message)

    def window_opened(self) -> None:
        if self.drained is not None:
            self.drained.set()

    def cancel(self) -> None:
        """The stream is over without our answer (reset, timed out, connection gone)."""
        self.ended = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.window_opened()

    # -- running ---------------------------------------------------------------------------

    async def _answer_when_ready(self, answer: Awaitable[bytes]) -> None:
        try:
            response = await answer
        except CallError as exc:
            self.finish(exc.code, exc.message)
            return
        if not self.ended:
            self.answered = True
            self.core.answer_unary(self.stream_id, response)
            self._done()

    async def _run(self, handler: Any, message: bytes | None) -> None:
        """A grpc servicer method to completion, then its status in the trailers."""
        context = Context(self, handler.response_serializer)
        try:
            await invoke(handler, self._request(handler, message), context)
            code, text = context.status()
        except CallError as exc:
            code, text = exc.code, exc.message
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("%s failed", handler.unary_unary or handler.stream_stream)
            code, text = grpc.StatusCode.INTERNAL, "internal error; see the sidecar log"
        self.finish(code, text)

    def _request(self, handler: Any, message: bytes | None) -> Any:
        parse = handler.request_deserializer or (lambda raw: raw)
        if message is None:
            return self._requests(parse)
        try:
            return parse(message)
        except Exception as exc:
            raise CallError(grpc.StatusCode.INTERNAL, "cannot parse the request message") from exc

    async def _requests(self, parse: Callable[[bytes], Any]) -> AsyncIterator[Any]:
        assert self.inbox is not None
        while (message := await self.inbox.get()) is not None:
            self.core.message_consumed(self.stream_id)  # the client may send the next
            self.conn.flush()
            try:
                request = parse(message)
            except Exception as exc:
                raise CallError(grpc.StatusCode.INTERNAL, "cannot parse a request message") from exc
            yield request

    def finish(self, code: grpc.StatusCode, text: str) -> None:
        """End the call with `code` after what it sent."""
        if not self.ended:
            self.answered = True
            self.core.end_call(self.stream_id, code.value[0], text)
            self._done()

    def _done(self) -> None:
        self.ended = True
        self.conn.flush()
        self.conn.call_done(self.stream_id)

    # -- what a Context asks (context.py) ---------------------------------------------------

    def send_message(self, message: bytes) -> None:
        if not self.ended:
            self.core.send_message(self.stream_id, message)

    def flush(self) -> None:
        self.conn.flush()

    async def wait_drained(self) -> None:
        core, stream_id = self.core, self.stream_id
        while not self.ended and core.pending_output(stream_id) > WRITE_HIGH_WATER:
            self.drained = self.drained or asyncio.Event()
            self.drained.clear()
            await self.drained.wait()

    def cancelled(self) -> bool:
        return self.ended and not self.answered

    def peer(self) -> str:
        return f"ipv4:{self.conn.peer}"
