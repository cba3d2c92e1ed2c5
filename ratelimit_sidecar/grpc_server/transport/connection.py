"""One connection of the gRPC port: the asyncio side of the protocol core.

Read, hand the octets to the core, act on its events, write what it queued, arm its timer: the
HTTP/2 and gRPC rules all live in the core (grpc_server/protocol/). What stays here is what
needs the event loop: the transport, the timer, the handler tasks (calls.py), TLS's handshake,
and taking turns with other connections (a read of many frames is handled `frames_per_turn` at
a time, reading paused in between).

A ShouldRateLimit whose answer needs no wait is answered inline, in the read that completed its
request: all the answers of one read go out in one write.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import sslproto
from typing import cast

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.transport.aging import Aging
from ratelimit_sidecar.grpc_server.transport.calls import Call
from ratelimit_sidecar.grpc_server.transport.port import Port
from ratelimit_sidecar.grpc_server.transport.status import CallError

log = logging.getLogger("ratelimit_sidecar.transport")

WRITE_HIGH_WATER = 256 * 1024  # answers buffered for a slow reader before its reads pause
CLOSE_TIMEOUT_S = 5.0  # a closing connection whose peer does not read is cut after this


class ServerConnection(asyncio.Protocol):
    """The server side of one client connection; `port` holds what all connections share."""

    def __init__(self, port: Port) -> None:
        self.port = port
        self.loop = asyncio.get_running_loop()
        self.core: Connection | None = None  # made once the connection is ready (after TLS)
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self.peer = ""
        self.last_active = self.loop.time()
        self.closed = False
        self.reading_paused = False  # by the write side: a slow reader
        self.yielding = False  # reading paused until the backlog of frames is handled
        self._turn: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._aging: Aging | None = None
        self._handshake_started = 0.0

    # -- the connection's life ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing
        if self.transport is not None:  # TLS's transport, its handshake done (see _start_tls)
            self._secured(transport)
            return
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self.port.admission.admit(self):
            self.refuse()
        elif self.port.tls is None:
            self._ready()
        else:
            self._start_tls(transport)

    def _start_tls(self, raw: asyncio.Transport) -> None:
        """TLS between the socket and this protocol, set up before any octet is read (so the
        connection counts against the caps while it shakes hands), within the port's timeout;
        the TLS layer calls `connection_made` again once the handshake is done."""
        tls = self.port.tls
        assert tls is not None
        done = self.loop.create_future()
        done.add_done_callback(self._handshake_done)
        layer = sslproto.SSLProtocol(
            self.loop, self, tls.server_context(), done, server_side=True,
            ssl_handshake_timeout=self.port.options.tls_handshake_timeout_s,  # type: ignore[arg-type]
        )  # fmt: skip
        self._handshake_started = self.loop.time()
        raw.set_protocol(layer)
        layer.connection_made(raw)

    def _handshake_done(self, done: asyncio.Future[None]) -> None:
        if done.cancelled() or done.exception() is None:
            return
        took = self.loop.time() - self._handshake_started
        self.port.admission.tls_failed(took >= self.port.options.tls_handshake_timeout_s)
        self.closed = True  # the TLS layer closes the socket; this protocol never opened
        self.port.admission.left(self)

    def _secured(self, secure: asyncio.Transport) -> None:
        tls = self.port.tls
        assert tls is not None
        self.transport = secure
        secure.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if not tls.peer_allowed(secure.get_extra_info("peercert")):
            log.warning("a TLS client without the required SAN %s: closed", tls.files.client_san)
            self.close()
            return
        self._ready()

    def _ready(self) -> None:
        core = self.core = self.port.new_core(self.loop.time())
        self._write(core.data_to_send())  # our SETTINGS: the server's preface
        self._arm_timer()
        if self.port.options.max_age is not None:
            self._aging = Aging(self, *self.port.options.max_age)

    def connection_lost(self, _exc: Exception | None) -> None:
        self.closed = True
        for handle in (self._turn, self._timer, self._aging):
            if handle is not None:
                handle.cancel()
        if self.core is not None:
            self.core.connection_lost()  # what its streams reserved goes back to the budget
        for call in self.calls.values():
            call.cancel()
        self.calls.clear()
        self.port.admission.left(self)

    def pause_writing(self) -> None:
        """The peer reads slower than we answer: stop taking its requests until it catches up."""
        if self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed and self.reading_paused:
            self.reading_paused = False
            if not self.yielding:
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        """The peer closed its side: answer the calls it sent, then close (over TLS the
        transport closes at once: TLS has no half-closed connection)."""
        if self.core is not None:
            self.core.drain()
            self.flush()
        return self.port.tls is None

    # -- reading -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        core = self.core
        if core is None or self.closed:
            return
        now = self.last_active = self.loop.time()
        self._handle(core.receive(data, now))
        self.flush()
        if core.backlogged:
            self._take_turns()
        else:
            self._arm_timer()

    def _take_turns(self) -> None:
        """More complete frames are buffered: let other connections have the loop first, with
        reading paused meanwhile, so that one flood cannot hold it for long."""
        if self.transport is None or self.closed:
            return
        if not self.yielding:
            self.yielding = True
            self.transport.pause_reading()
        self._turn = self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn = None
        core = self.core
        if core is None or self.closed:
            return
        self._handle(core.receive(b"", self.loop.time()))
        self.flush()
        if core.backlogged:
            self._take_turns()
            return
        self._arm_timer()
        if self.yielding and self.transport is not None and not self.closed:
            self.yielding = False
            if not self.reading_paused:
                self.transport.resume_reading()

    def _handle(self, events: list[ev.Event]) -> None:
        for event in events:
            if type(event) is ev.UnaryRequest:
                self._unary(event)
            else:
                self._other(event)

    def _unary(self, event: ev.UnaryRequest) -> None:
        """A unary call's whole request: a fast answer inline, else a task."""
        stream_id = event.stream_id
        method = self.port.methods.by_path[event.head.path]  # the core's route put it there
        if method.handler is not None:
            self._call(stream_id, event.deadline).run_handler(method.handler, event.message)
            return
        try:
            if method.fast is not None:
                answer = method.fast(event.message)
            else:
                assert method.with_headers is not None
                answer = method.with_headers(event.head.headers, event.message)
        except CallError as exc:
            self.core_or_fail().end_call(stream_id, exc.code.value[0], exc.message)
            return
        if type(answer) is bytes:
            self.core_or_fail().answer_unary(stream_id, answer)
        else:
            self._call(stream_id, event.deadline).await_answer(answer)  # type: ignore[arg-type]

    def _other(self, event: ev.Event) -> None:
        if isinstance(event, ev.RequestStarted):
            method = self.port.methods.by_path[event.head.path]
            self._call(event.stream_id, event.deadline).run_handler(method.handler, None)
        elif isinstance(event, ev.Message | ev.RequestEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.deliver(event.data if isinstance(event, ev.Message) else None)
        elif isinstance(event, ev.StreamReset):
            ended = self.calls.pop(event.stream_id, None)
            if ended is not None:
                ended.cancel()
        elif isinstance(event, ev.WindowOpened):
            waiting = self.calls.get(event.stream_id)
            if waiting is not None:
                waiting.window_opened()
        elif isinstance(event, ev.ConnectionEnded) and event.code != f.NO_ERROR:
            log.info("HTTP/2 connection from %s ended: %s (%s)", self.peer, event.reason,
                     f.error_name(event.code))  # fmt: skip

    def _call(self, stream_id: int, deadline: float | None) -> Call:
        call = self.calls[stream_id] = Call(self, self.core_or_fail(), stream_id, deadline)
        return call

    def call_done(self, stream_id: int) -> None:
        self.calls.pop(stream_id, None)
        self._arm_timer()

    def core_or_fail(self) -> Connection:
        assert self.core is not None
        return self.core

    # -- writing and timers -------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the core queued; close once it says the connection is over."""
        core = self.core
        if core is None or self.closed:
            return
        self._write(core.data_to_send())
        if core.closing:
            self.close()

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None:
            self.transport.write(data)

    def _arm_timer(self) -> None:
        core = self.core
        due = None if core is None or self.closed else core.next_timer()
        if due is None:
            return
        if self._timer is not None:
            if self._timer_due <= due:
                return  # an earlier one is armed; it re-arms when it runs
            self._timer.cancel()
        self._timer, self._timer_due = self.loop.call_at(due, self._on_timer), due

    def _on_timer(self) -> None:
        self._timer = None
        core = self.core
        if core is None or self.closed:
            return
        self._handle(core.on_timer(self.loop.time()))
        self.flush()
        self._arm_timer()

    # -- ending ---------------------------------------------------------------------------------

    def goaway(self) -> None:
        """Graceful drain: no new streams; close once the open ones are answered."""
        if self.core is None:
            self.close()
            return
        self.core.drain()
        self.flush()

    def fail(self, code: int, reason: str) -> None:
        """End the connection now: GOAWAY with `code`, then close."""
        if self.core is None:
            self.close()
            return
        self.core.close(code, reason)
        self.flush()

    def refuse(self) -> None:
        """No room for this connection (admission.py): GOAWAY before any stream, then close."""
        core = self.core = self.port.new_core(self.loop.time())
        if self.port.tls is None:
            core.close(f.NO_ERROR, "too many connections")
            self.flush()
        else:
            self.close()

    def idle(self) -> bool:
        """Without open calls: may be closed to make room for a new connection."""
        return self.core is None or not self.core.streams

    def close(self) -> None:
        if self.transport is None or self.closed:
            return
        self.closed = True
        for call in self.calls.values():
            call.cancel()
        self.calls.clear()
        transport = self.transport
        transport.close()  # sends what is buffered first; a peer that never reads...
        self.loop.call_later(CLOSE_TIMEOUT_S, transport.abort)  # ...is cut
