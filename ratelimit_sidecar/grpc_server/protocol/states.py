"""The stream states of RFC 9113 §5.1 on a server that never pushes, and one table of what a
received frame does in each.

    idle --HEADERS--> open --END_STREAM received--> half-closed (remote) --END_STREAM sent--> closed
                        \\--END_STREAM sent--> half-closed (local) --END_STREAM received--/
    any state but idle --RST_STREAM sent or received--> closed

"reserved (local)" and "reserved (remote)" never occur here: a stream is reserved only by a
PUSH_PROMISE, which this server never sends (it advertises SETTINGS_ENABLE_PUSH 0) and which a
client may never send (§8.4). Streams the client could open are the odd ones (§5.1.1); an even
stream is the server's to open, so it stays idle for ever.

§5.1 describes "closed" with two sets of rules, so the table has two closed rows:
- CLOSED: after END_STREAM both ways, or after the peer's RST_STREAM. The peer knows the stream
  ended, so it may send only PRIORITY, and WINDOW_UPDATE or RST_STREAM that crossed our closing
  frame (ignored). DATA is a stream error STREAM_CLOSED (§6.1); any other frame may be treated
  as a connection error STREAM_CLOSED (§5.1), which HEADERS is.
- RESET_SENT: after our RST_STREAM. The peer may have sent anything before it read ours, so
  every frame is minimally processed and dropped (§5.1: header blocks still update the HPACK
  table, DATA still counts against the connection's window).
A server cannot keep every closed stream, so ClosedStreams remembers the last streams it reset
(their frames are dropped, as above) and the identifiers a client skipped (HEADERS on one is
§5.1.1's "unexpected stream identifier", PROTOCOL_ERROR); any other stream the client opened
before its newest is CLOSED.

Frames that belong to the connection (SETTINGS, PING, GOAWAY: §6.5, §6.7, §6.8) on a stream, and
PUSH_PROMISE from a client (§8.4), are connection errors PROTOCOL_ERROR whatever the state.
CONTINUATION is valid only inside a header block, which the connection gathers before this
table is read (§6.10); met here, outside a block, it is a connection error PROTOCOL_ERROR.
"""

from __future__ import annotations

from typing import Final

from ratelimit_sidecar.grpc_server.protocol import frames as f

IDLE: Final = 0
OPEN: Final = 1
HALF_CLOSED_REMOTE: Final = 2
HALF_CLOSED_LOCAL: Final = 3
CLOSED: Final = 4
RESET_SENT: Final = 5  # closed by our RST_STREAM
STATE_NAMES: Final = (
    "idle", "open", "half-closed (remote)", "half-closed (local)", "closed", "closed (reset sent)",
)  # fmt: skip

# What a received frame does: ACCEPT (processed), IGNORE (minimally processed, dropped), or an
# error: STREAM_ERROR or CONNECTION_ERROR plus the code it carries.
ACCEPT: Final = 0
IGNORE: Final = 1
STREAM_ERROR: Final = 0x100
CONNECTION_ERROR: Final = 0x200
SCOPE: Final = 0x300  # the mask of a verdict's kind of error; the code is the low byte

_PROTOCOL: Final = CONNECTION_ERROR | f.PROTOCOL_ERROR
_STREAM_CLOSED: Final = STREAM_ERROR | f.STREAM_CLOSED

# fmt: off
RULES: Final[dict[tuple[int, int], int]] = {
    # idle: HEADERS opens the stream, PRIORITY is fine, anything else is a PROTOCOL_ERROR.
    (IDLE, f.DATA): _PROTOCOL,
    (IDLE, f.HEADERS): ACCEPT,
    (IDLE, f.PRIORITY): ACCEPT,
    (IDLE, f.RST_STREAM): _PROTOCOL,
    (IDLE, f.WINDOW_UPDATE): _PROTOCOL,
    # open: both peers may send every type; END_STREAM half-closes, RST_STREAM closes.
    (OPEN, f.DATA): ACCEPT,
    (OPEN, f.HEADERS): ACCEPT,  # trailers (§8.1: it must carry END_STREAM)
    (OPEN, f.PRIORITY): ACCEPT,
    (OPEN, f.RST_STREAM): ACCEPT,
    (OPEN, f.WINDOW_UPDATE): ACCEPT,
    # half-closed (remote): the client said it is done; only WINDOW_UPDATE, PRIORITY and
    # RST_STREAM may follow, anything else is a stream error STREAM_CLOSED.
    (HALF_CLOSED_REMOTE, f.DATA): _STREAM_CLOSED,
    (HALF_CLOSED_REMOTE, f.HEADERS): _STREAM_CLOSED,
    (HALF_CLOSED_REMOTE, f.PRIORITY): ACCEPT,
    (HALF_CLOSED_REMOTE, f.RST_STREAM): ACCEPT,
    (HALF_CLOSED_REMOTE, f.WINDOW_UPDATE): ACCEPT,
    # half-closed (local): we are done sending; any frame may be received.
    (HALF_CLOSED_LOCAL, f.DATA): ACCEPT,
    (HALF_CLOSED_LOCAL, f.HEADERS): ACCEPT,
    (HALF_CLOSED_LOCAL, f.PRIORITY): ACCEPT,
    (HALF_CLOSED_LOCAL, f.RST_STREAM): ACCEPT,
    (HALF_CLOSED_LOCAL, f.WINDOW_UPDATE): ACCEPT,
    # closed (END_STREAM both ways, or the peer's RST_STREAM): see the module's docstring.
    (CLOSED, f.DATA): _STREAM_CLOSED,
    (CLOSED, f.HEADERS): CONNECTION_ERROR | f.STREAM_CLOSED,
    (CLOSED, f.PRIORITY): ACCEPT,
    (CLOSED, f.RST_STREAM): IGNORE,
    (CLOSED, f.WINDOW_UPDATE): IGNORE,
    # closed by our RST_STREAM: whatever the peer sent before reading it is dropped.
    (RESET_SENT, f.DATA): IGNORE,
    (RESET_SENT, f.HEADERS): IGNORE,
    (RESET_SENT, f.PRIORITY): ACCEPT,
    (RESET_SENT, f.RST_STREAM): IGNORE,
    (RESET_SENT, f.WINDOW_UPDATE): IGNORE,
}
# fmt: on
for _state in range(len(STATE_NAMES)):  # the same in every state: see the module's docstring
    for _kind in (f.SETTINGS, f.PING, f.GOAWAY, f.PUSH_PROMISE, f.CONTINUATION):
        RULES[(_state, _kind)] = _PROTOCOL

# RULES as RECEIVE[state][frame type], for the frame loop.
RECEIVE: Final[tuple[tuple[int, ...], ...]] = tuple(
    tuple(RULES[(state, kind)] for kind in range(f.FRAME_TYPES))
    for state in range(len(STATE_NAMES))
)

# Transitions (§5.1) on the END_STREAM flag; RST_STREAM either way leads to a closed state.
AFTER_END_RECEIVED: Final = (
    IDLE,
    HALF_CLOSED_REMOTE,
    HALF_CLOSED_REMOTE,
    CLOSED,
    CLOSED,
    RESET_SENT,
)
AFTER_END_SENT: Final = (IDLE, HALF_CLOSED_LOCAL, CLOSED, HALF_CLOSED_LOCAL, CLOSED, RESET_SENT)


def describe(verdict: int) -> str:
    """A verdict in words, for reasons and tests: "stream error STREAM_CLOSED"."""
    if verdict == ACCEPT:
        return "accept"
    if verdict == IGNORE:
        return "ignore"
    scope = "stream" if verdict & SCOPE == STREAM_ERROR else "connection"
    return f"{scope} error {f.error_name(verdict & 0xFF)}"


class ClosedStreams:
    """What is left of the streams a connection no longer holds: the ones we reset, while
    remembered (frames on them are dropped), and the identifiers the client skipped."""

    __slots__ = ("_capacity", "_reset", "_skipped")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._reset: dict[int, None] = {}  # oldest first
        self._skipped: list[tuple[int, int]] = []  # [first, last] ranges of odd identifiers

    def reset_sent(self, stream_id: int) -> None:
        if len(self._reset) >= self._capacity:
            del self._reset[next(iter(self._reset))]
        self._reset[stream_id] = None

    def opened(self, stream_id: int, newest: int) -> None:
        """The client opened `stream_id` after `newest`: the idle ones between close (§5.1.1)."""
        expected = newest + 2 if newest else 1
        if stream_id > expected:
            self.skipped(expected, stream_id - 2)

    def skipped(self, first: int, last: int) -> None:
        if len(self._skipped) >= self._capacity:
            del self._skipped[0]  # forgotten: HEADERS on one is then STREAM_CLOSED, still fatal
        self._skipped.append((first, last))

    def state(self, stream_id: int, newest: int) -> int:
        """The state of `stream_id`, not held by the connection, whose newest stream is `newest`."""
        if stream_id in self._reset:
            return RESET_SENT
        if stream_id > newest or not stream_id & 1:
            return IDLE
        return CLOSED

    def was_skipped(self, stream_id: int) -> bool:
        return any(first <= stream_id <= last for first, last in self._skipped)
