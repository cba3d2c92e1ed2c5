"""What a request's header block asks, checked against HTTP/2's rules and then gRPC's.

HTTP/2 (RFC 9113) makes a request *malformed* (§8.1.1: a stream error PROTOCOL_ERROR) when:
- a field name is empty, or has an octet 0x00-0x20, 0x41-0x5A (uppercase) or 0x7F-0xFF, or a
  colon other than a pseudo-header's leading one (§8.2, §8.2.1);
- a field value has NUL, CR or LF, or starts or ends with a space or tab (§8.2.1);
- a connection-specific field is present (connection, keep-alive, proxy-connection,
  transfer-encoding, upgrade), or `te` has a value other than `trailers` (§8.2.2);
- a pseudo-header follows a regular field, is not a request's (`:status`), is unknown (§8.3),
  or appears twice (§8.3.1); `:protocol` counts as unknown, as this server does not offer
  extended CONNECT (RFC 8441);
- `:method`, `:scheme` or `:path` is missing (CONNECT: `:authority` is missing, or `:scheme` or
  `:path` present), or `:path` is empty (§8.3.1);
- `host` names another authority than `:authority` (§8.3.1, a SHOULD);
- `content-length` is not a number, or two of them differ (§8.6); that the DATA adds up to it
  is checked as the DATA arrives (stream.py).
Trailers carry no pseudo-header (§8.1) and follow the same field rules.

Then gRPC's (PROTOCOL-HTTP2.md in grpc/grpc), each answered, not reset, as gRPC servers do:
a method other than POST, HTTP 405; a content-type other than application/grpc (alone, or
followed by "+" or ";"), HTTP 415; a header list over the advertised
SETTINGS_MAX_HEADER_LIST_SIZE, gRPC RESOURCE_EXHAUSTED (HTTP 431 when not gRPC); a path no
method answers, UNIMPLEMENTED; a `grpc-encoding` other than identity, UNIMPLEMENTED with
`grpc-accept-encoding: identity` (messages are not decompressed); a malformed `grpc-timeout`,
INTERNAL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ratelimit_sidecar.grpc_server.protocol import responses

# What a request's route is; a `Route` maps a request's :path to it.
UNKNOWN_METHOD: Final = 0
UNARY: Final = 1  # one request message (the response may stream: a server-streaming call)
STREAMING: Final = 2  # a stream of request messages (client- or bidirectional streaming)
REFUSED: Final = 3  # answered at once with `RequestHead.refusal`
MALFORMED: Final = 4  # a stream error PROTOCOL_ERROR
Route = Callable[[bytes], int]

GRPC_INTERNAL: Final = 13
GRPC_UNIMPLEMENTED: Final = 12
GRPC_RESOURCE_EXHAUSTED: Final = 8
OVERSIZED: Final = "a header list over the advertised limit"  # RequestHead.problem of a refusal
FIELD_OVERHEAD: Final = 32  # octets a field costs beyond its name and value (§6.5.2)
_REQUEST_PSEUDO: Final = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC: Final = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_BAD_NAME_OCTETS: Final = bytes((*range(0x21), *range(0x41, 0x5B), *range(0x7F, 0x100), 0x3A))
_TIMEOUT_UNITS: Final = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class RequestHead:
    """What a request header block asks; shared by every call that repeats the block, so it is
    read-only. `kind` is UNARY or STREAMING, or REFUSED (answer `refusal`, a header block that
    ends the stream) or MALFORMED (`problem` says why)."""

    __slots__ = (
        "body", "content_length", "headers", "kind", "path", "problem", "refusal", "timeout_s",
    )  # fmt: skip

    def __init__(self, headers: list[tuple[bytes, bytes]], kind: int, path: bytes = b"") -> None:
        self.headers = headers
        self.kind = kind
        self.path = path
        self.problem = ""
        self.refusal = b""
        self.body = b""  # the refusal's body, for an HTTP status (gRPC refusals have none)
        self.timeout_s = -1.0  # grpc-timeout, when given
        self.content_length = -1  # when given


def request_head(headers: list[tuple[bytes, bytes]], route: Route, max_list: int) -> RequestHead:
    """What `headers` (a request's decoded block) ask, under a header list limit of `max_list`."""
    problem, pseudo = _malformation(headers)
    if problem:
        return _malformed(headers, problem)
    fields = dict(headers)
    length = fields.get(b"content-length")
    head = RequestHead(headers, REFUSED, pseudo.get(b":path", b""))
    if length is not None:
        head.content_length = int(length)
    _refuse_http(head, pseudo, fields, max_list)
    if not head.refusal:
        kind = route(head.path)
        head.refusal = _grpc_refusal(kind, head.path, fields)
        head.kind = REFUSED if head.refusal else kind
        timeout = fields.get(b"grpc-timeout")
        head.timeout_s = -1.0 if timeout is None else grpc_timeout_s(timeout)
    return head


def trailers_problem(headers: list[tuple[bytes, bytes]]) -> str:
    """Why a request's trailers are malformed ("" when they are not): §8.1, §8.2."""
    for name, value in headers:
        problem = f"a pseudo-header in trailers: {name!r}" if name[:1] == b":" else ""
        problem = problem or _field_problem(name, value)
        if problem:
            return problem
    return ""


def grpc_timeout_s(value: bytes) -> float:
    """A `grpc-timeout` in seconds ("100m": 0.1), or -1 when malformed: 1 to 8 digits, a unit."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return -1.0
    return int(digits) * unit


def _malformed(headers: list[tuple[bytes, bytes]], problem: str) -> RequestHead:
    head = RequestHead(headers, MALFORMED)
    head.problem = problem
    return head


def _malformation(headers: list[tuple[bytes, bytes]]) -> tuple[str, dict[bytes, bytes]]:
    """Why the request is malformed ("" when it is not), and its pseudo-headers."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            problem = _pseudo_problem(name, pseudo, regular) or _value_problem(name, value)
            pseudo[name] = value
        else:
            regular = True
            problem = _field_problem(name, value)
        if problem:
            return problem, pseudo
    return _required_problem(pseudo) or _length_problem(headers) or _host_problem(headers), pseudo


def _pseudo_problem(name: bytes, seen: dict[bytes, bytes], after_regular: bool) -> str:
    if after_regular:
        return f"pseudo-header {name!r} after a regular field"
    if name not in _REQUEST_PSEUDO:
        return f"pseudo-header {name!r} is not a request's"
    return f"pseudo-header {name!r} twice" if name in seen else ""


def _field_problem(name: bytes, value: bytes) -> str:
    if not name or len(name.translate(None, _BAD_NAME_OCTETS)) != len(name):
        return f"field name {name!r} is not lowercase visible ASCII"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific field {name!r}"
    if name == b"te" and value != b"trailers":
        return f"te: {value!r}"
    return _value_problem(name, value)


def _value_problem(name: bytes, value: bytes) -> str:
    if b"\0" in value or b"\r" in value or b"\n" in value:
        return f"field {name!r} has NUL, CR or LF in its value"
    if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        return f"field {name!r} has a value with whitespace around it"
    return ""


def _required_problem(pseudo: dict[bytes, bytes]) -> str:
    method = pseudo.get(b":method")
    if method is None:
        return "no :method"
    if method == b"CONNECT":
        if b":authority" not in pseudo or b":scheme" in pseudo or b":path" in pseudo:
            return "CONNECT needs :authority and neither :scheme nor :path"
        return ""
    if b":scheme" not in pseudo or b":path" not in pseudo:
        return "no :scheme" if b":scheme" not in pseudo else "no :path"
    return "an empty :path" if not pseudo[b":path"] else ""


def _length_problem(headers: list[tuple[bytes, bytes]]) -> str:
    lengths = {value for name, value in headers if name == b"content-length"}
    if not lengths:
        return ""
    if len(lengths) > 1 or not all(value.isdigit() and len(value) < 19 for value in lengths):
        return f"content-length {sorted(lengths)!r}"
    return ""


def _host_problem(headers: list[tuple[bytes, bytes]]) -> str:
    fields = dict(headers)
    host, authority = fields.get(b"host"), fields.get(b":authority")
    if host is not None and authority is not None and host != authority:
        return "host and :authority differ"
    return ""


def _refuse_http(
    head: RequestHead, pseudo: dict[bytes, bytes], fields: dict[bytes, bytes], max_list: int
) -> None:
    """Refuse a request that is not gRPC (an HTTP status and a text body), or too large."""
    content_type = fields.get(b"content-type", b"")
    grpc = content_type == b"application/grpc" or content_type[:17] in (
        b"application/grpc+",
        b"application/grpc;",
    )
    grpc = grpc and pseudo.get(b":method") == b"POST"
    status = 0 if grpc else 405 if pseudo.get(b":method") != b"POST" else 415
    if _list_size(head.headers) > max_list:
        head.problem = OVERSIZED
        if grpc:
            message = f"headers over the limit of {max_list} octets"
            head.refusal = responses.grpc_status_block(GRPC_RESOURCE_EXHAUSTED, message, True)
            return
        status = 431
    if status:
        head.refusal = responses.http_status_block(status)
        head.body = responses.HTTP_REFUSALS[status]


def _list_size(headers: list[tuple[bytes, bytes]]) -> int:
    return sum(len(name) + len(value) + FIELD_OVERHEAD for name, value in headers)


def _grpc_refusal(kind: int, path: bytes, fields: dict[bytes, bytes]) -> bytes:
    """The trailers-only answer to a gRPC call this server does not take (b"" if it does)."""
    if kind == UNKNOWN_METHOD:
        text = f"unknown method {path.decode('utf-8', 'replace')}"
        return responses.grpc_status_block(GRPC_UNIMPLEMENTED, text, True)
    encoding = fields.get(b"grpc-encoding", b"identity")
    if encoding != b"identity":
        name = encoding.decode("ascii", "replace")
        text = f"grpc-encoding {name} is not supported: send messages uncompressed"
        block = responses.grpc_status_block(GRPC_UNIMPLEMENTED, text, True)
        return block + responses.ACCEPT_IDENTITY
    timeout = fields.get(b"grpc-timeout")
    if timeout is not None and grpc_timeout_s(timeout) < 0:
        text = f"bad grpc-timeout {timeout.decode('ascii', 'replace')}"
        return responses.grpc_status_block(GRPC_INTERNAL, text, True)
    return b""
