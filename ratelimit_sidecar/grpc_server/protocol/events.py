"""What the protocol core tells its adapter, one small object per event, in wire order.

A unary call (one request message; `Route` says which paths) yields exactly one UnaryRequest,
once its whole request has arrived: its headers, its message and its end in one event. A
streaming call yields RequestStarted once, a Message per request message, and RequestEnded once
the client half-closes. Either may then see StreamReset: the call is over without the adapter's
answer, and its handler is to be cancelled. Calls the core answers by itself (refused,
malformed, timed out before their request was whole) yield nothing.
"""

from __future__ import annotations

from ratelimit_sidecar.grpc_server.protocol.validation import RequestHead


class UnaryRequest:
    """A unary call whose request arrived whole: answer it with `Connection.answer_unary` (or
    `send_message` and `end_call`). `deadline` is its grpc-timeout on the core's clock."""

    __slots__ = ("deadline", "head", "message", "stream_id")

    def __init__(
        self, stream_id: int, head: RequestHead, deadline: float | None, message: bytes
    ) -> None:
        self.stream_id = stream_id
        self.head = head
        self.deadline = deadline
        self.message = message


class RequestStarted:
    """A streaming call's headers: its Message events follow."""

    __slots__ = ("deadline", "head", "stream_id")

    def __init__(self, stream_id: int, head: RequestHead, deadline: float | None) -> None:
        self.stream_id = stream_id
        self.head = head
        self.deadline = deadline


class Message:
    """One request message of a streaming call. The adapter calls `Connection.message_consumed`
    once it has taken it: only then does the client get the flow-control credit to send more."""

    __slots__ = ("data", "stream_id")

    def __init__(self, stream_id: int, data: bytes) -> None:
        self.stream_id = stream_id
        self.data = data


class RequestEnded:
    """The client half-closed a streaming call: no message follows."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class StreamReset:
    """A call the adapter holds is over: the client reset the stream (`code`, its RST_STREAM's
    error code), or the core ended it: a stream error (`code` sent in RST_STREAM) or a timeout
    answered with a gRPC status (`code` NO_ERROR). `reason` says which, in words."""

    __slots__ = ("code", "reason", "stream_id")

    def __init__(self, stream_id: int, code: int, reason: str) -> None:
        self.stream_id = stream_id
        self.code = code
        self.reason = reason


class WindowOpened:
    """Every response octet queued on the stream has been sent: a writer waiting for flow
    control may go on."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class ConnectionEnded:
    """The core ended the connection (GOAWAY with `code`, or a finished drain): the adapter
    writes `data_to_send()`, closes the transport and cancels the calls it holds."""

    __slots__ = ("code", "reason")

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


Event = (
    UnaryRequest
    | RequestStarted
    | Message
    | RequestEnded
    | StreamReset
    | WindowOpened
    | ConnectionEnded
)
