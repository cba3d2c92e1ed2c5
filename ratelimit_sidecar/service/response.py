"""Encodes the RateLimitResponse Envoy sees, straight from a core Decision to wire bytes.

Envoy matches statuses to its descriptors by index, computes its `x-ratelimit-*` headers from
the statuses (the one with the least `limit_remaining` wins), and on OVER_LIMIT sends our
`response_headers_to_add` and `raw_body` to the client.

Why bytes and not protobuf objects: building, serializing and freeing message objects was the
largest cost of a decision. The encoding below is plain protobuf wire format for the fields we
set (numbers from proto/envoy/service/ratelimit/v3/rls.proto); each limit's `current_limit` is
encoded once and reused. The fast path (service/fast_path.py) joins an admitted answer from the
fields this encodes. Tests parse the bytes with the generated classes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.types import OK, OVER_LIMIT, Decision, Verdict

UNLIMITED_REMAINING = 2**32 - 1

# Field tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
_OVERALL_CODE, _HEADER, _RAW_BODY = b"\x08", b"\x1a", b"\x2a"
_STATUS: Final = b"\x12"
_CODE, _CURRENT_LIMIT, _REMAINING, _RESET = b"\x08", b"\x12", b"\x18", b"\x22"
_OK_STATUS, _OVER_STATUS = b"\x08\x01", b"\x08\x02"
_OK_CODE: Final = _OVERALL_CODE + b"\x01"
_UNMATCHED_FIELD = _STATUS + b"\x02" + _OK_STATUS
_OK_OPENING = _OK_CODE + _STATUS
MAX_CACHED_RESETS = 65_536  # distinct refusals kept encoded
LISTED_RESETS = 86_401  # `duration_until_reset` values kept encoded: whole seconds to a day


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    ietf_headers: bool = False  # add RateLimit-Policy / RateLimit (draft-ietf-httpapi)
    # The reference's global settings (service/overall.py): a refused request answered OK with
    # every descriptor's own status kept; quota mode for every descriptor.
    shadow_mode: bool = False
    quota_mode: bool = False
    dynamic_metadata: bool = False  # add the reference's dynamic_metadata (dynamic_metadata.py)
    # The reference's LIMIT_RESPONSE_HEADERS_ENABLED: the names of its limit, remaining and
    # reset headers, added to every answer with a limit; None: off.
    reference_headers: tuple[str, str, str] | None = None


_SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(0x80))
_CONTINUED: Final = tuple(bytes((i | 0x80,)) for i in range(0x80))  # 7 low bits, more to follow
# The `limit_remaining` field of a count under 0x80 (0: none, protobuf's default), and the tag
# with the first byte of a larger one's varint.
_REMAINING_SMALL: Final = (b"", *(_REMAINING + v for v in _SMALL_VARINTS[1:]))
_REMAINING_CONTINUED: Final = tuple(_REMAINING + v for v in _CONTINUED)
MAX_HIGH_PARTS = 4096


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    return _CONTINUED[value & 0x7F] + varint(value >> 7)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


_UNLIMITED_REMAINING_FIELD: Final = _REMAINING + varint(UNLIMITED_REMAINING)


class ResponseEncoder:
    """Turns decisions into encoded responses. Keeps encoded what repeats: each limit's
    `current_limit`, each second's `duration_until_reset`, a refusal's headers and body."""

    def __init__(self, options: ResponseOptions | None = None) -> None:
        self.options = options or ResponseOptions()
        self._ietf = self.options.ietf_headers or self.options.reference_headers is not None
        # Per limit: (the limit, its current_limit field, an admitted status's start).
        self._limits: dict[int, tuple[RateLimit, bytes, bytes]] = {}
        self._resets: list[bytes] = []  # per whole second, grown as used; b"": not encoded yet
        # A count changes its low 7 bits with every request and the rest once in 128: the rest
        # is kept encoded, the last one at hand, the others in a bounded dict.
        self._high, self._high_part = -1, b""
        self._high_parts: dict[int, bytes] = {}
        self._refusals: dict[tuple[int, int], tuple[RateLimit | None, bytes, bytes]] = {}

    def encode(self, decision: Decision) -> bytes:
        over = decision.code is OVER_LIMIT
        verdicts = decision.verdicts
        if not over and not self._ietf:  # an OK answer: statuses only
            return _OK_CODE + self.statuses(verdicts)
        parts = [_OVERALL_CODE, b"\x02" if over else b"\x01", *map(self._status_field, verdicts)]
        own, body = self._refusal(decision) if over else (b"", b"")
        headers = ietf_headers(decision) if self.options.ietf_headers else []
        if self.options.reference_headers is not None:
            headers += reference_headers(decision, self.options.reference_headers)
        parts += [own, *[_field(_HEADER, _header(k, v)) for k, v in headers], body]
        return b"".join(parts)

    def statuses(self, verdicts: Iterable[Verdict]) -> bytes:
        """Encoded DescriptorStatus fields, in order."""
        return b"".join([self._status_field(v) for v in verdicts])

    def ok_opening(self, before: Sequence[Verdict]) -> bytes:
        """An OK answer up to the tag of the status after `before`'s (a status is a length-
        delimited field: its tag, its length, its fields); with none before, one shared object."""
        return _OK_CODE + self.statuses(before) + _STATUS if before else _OK_OPENING

    def admitted_head(self, limit: RateLimit) -> bytes:
        """How the status of a descriptor admitted under `limit` starts: OK, current_limit. One
        bytes object per limit, shared by every request under it."""
        return self._limit_fields(limit)[2]

    def remaining_field(self, remaining: int) -> bytes:
        """A status's `limit_remaining` field; none for 0 (protobuf's default)."""
        if remaining < 0x80:
            return _REMAINING_SMALL[remaining]
        high = remaining >> 7
        if high != self._high:
            self._high, self._high_part = high, self._encoded_high(high)
        return _REMAINING_CONTINUED[remaining & 0x7F] + self._high_part

    def reset_field(self, ms: int) -> bytes:
        """A status's `duration_until_reset` field, kept per second up to a day's. Whole
        seconds, rounded up as Retry-After is: Envoy's `x-ratelimit-reset` shows only the
        seconds field, and the reference service answers whole seconds too."""
        seconds, resets = max(0, -(-ms // 1000)), self._resets
        if seconds < len(resets) and resets[seconds]:
            return resets[seconds]
        found = _field(_RESET, _duration(seconds))
        if seconds < LISTED_RESETS:  # grown as rules need it: a day's list costs 675 KiB
            resets.extend([b""] * (seconds + 1 - len(resets)))
            resets[seconds] = found
        return found

    def _encoded_high(self, high: int) -> bytes:
        found = self._high_parts.get(high)
        if found is None:
            if len(self._high_parts) >= MAX_HIGH_PARTS:
                self._high_parts.clear()
            found = self._high_parts[high] = varint(high)
        return found

    def _refusal(self, decision: Decision) -> tuple[bytes, bytes]:
        """A refusal's own header fields and body field, kept encoded per wait and limit: under
        a retry storm every answer is a refusal."""
        retry = retry_after_seconds(decision)
        limit = next(v for v in decision.verdicts if v.code is OVER_LIMIT).limit
        found = self._refusals.get((retry, id(limit)))
        if found is None or found[0] is not limit:
            if len(self._refusals) >= MAX_CACHED_RESETS:
                self._refusals.clear()
            own = [("retry-after", str(retry)), ("content-type", "application/json")]
            fields = b"".join([_field(_HEADER, _header(k, v)) for k, v in own])
            body = _field(_RAW_BODY, rejection_body(retry, limit))
            found = self._refusals[retry, id(limit)] = (limit, fields, body)
        return found[1], found[2]

    def _status_field(self, verdict: Verdict) -> bytes:
        if verdict.limit is None and not verdict.unlimited and verdict.code is OK:
            return _UNMATCHED_FIELD  # no rule: the same bytes every time
        return _field(_STATUS, self._status(verdict))

    def _status(self, verdict: Verdict) -> bytes:
        # A shadow rule is reported like any other (OK even when over, by the limiter), so that
        # Envoy's x-ratelimit-* headers describe it, as the reference service does.
        limit = verdict.limit
        code = _OVER_STATUS if verdict.code is OVER_LIMIT else _OK_STATUS
        if limit is None:
            return code + _UNLIMITED_REMAINING_FIELD if verdict.unlimited else code
        remaining = self.remaining_field(verdict.remaining)
        return code + self._limit_fields(limit)[1] + remaining + self.reset_field(verdict.reset_ms)

    def _limit_fields(self, limit: RateLimit) -> tuple[RateLimit, bytes, bytes]:
        cached = self._limits.get(id(limit))
        if cached is not None and cached[0] is limit:
            return cached
        if len(self._limits) > 4096:  # limits come from the config; bounded by reloads
            self._limits.clear()
        current = _field(_CURRENT_LIMIT, _limit(limit))
        cached = self._limits[id(limit)] = (limit, current, _OK_STATUS + current)
        return cached


def unmatched_response(count: int) -> bytes:
    """OK for every descriptor: the domain has no rules (an unknown domain)."""
    return _OK_CODE + _UNMATCHED_FIELD * count


def _limit(limit: RateLimit) -> bytes:
    """RateLimitResponse.RateLimit: requests_per_unit=1, unit=2, name=3, unit_multiplier=4."""
    out = b""
    if limit.requests_per_unit:
        out += b"\x08" + varint(limit.requests_per_unit)
    out += b"\x10" + varint(int(limit.unit))
    if limit.name:
        out += _field(b"\x1a", limit.name.encode())
    if limit.unit_multiplier > 1:  # a UInt32Value wrapper
        out += _field(b"\x22", b"\x08" + varint(limit.unit_multiplier))
    return out


def _duration(seconds: int) -> bytes:
    """google.protobuf.Duration of whole seconds (field 1)."""
    return b"\x08" + varint(seconds) if seconds else b""


def _header(key: str, value: str) -> bytes:
    """envoy.config.core.v3.HeaderValue: key=1, value=2."""
    return _field(b"\x0a", key.encode()) + _field(b"\x12", value.encode())


def retry_after_seconds(decision: Decision) -> int:
    """The longest refusal's wait in whole seconds, at least 1, rounded up so a client that
    waits is not rejected again."""
    wait = max([v.reset_ms for v in decision.verdicts if v.code is OVER_LIMIT], default=0)
    return max(1, -(-wait // 1000))


def rejection_body(retry: int, limit: RateLimit | None) -> bytes:
    error: dict[str, object] = {
        "code": "RATE_LIMITED",
        "message": f"Too many requests; retry in {retry} s.",
        "retry_after": retry,
    }
    if limit is not None:
        error["limit"] = limit.requests_per_unit
        error["window"] = limit.window_seconds
        if limit.name:
            error["name"] = limit.name
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def ietf_headers(decision: Decision) -> list[tuple[str, str]]:
    """`RateLimit-Policy` and `RateLimit` for the most constrained enforced descriptor."""
    limited = [v for v in decision.verdicts if v.limit is not None and not v.shadow]
    if not limited:
        return []
    tightest = min(limited, key=lambda v: (v.remaining, v.reset_ms))
    limit = tightest.limit
    assert limit is not None
    reset = max(0, -(-tightest.reset_ms // 1000))
    name = _policy_name(limit)
    return [
        ("ratelimit-policy", f'"{name}";q={limit.requests_per_unit};w={limit.window_seconds}'),
        ("ratelimit", f'"{name}";r={tightest.remaining};t={reset}'),
    ]


def reference_headers(decision: Decision, names: tuple[str, str, str]) -> list[tuple[str, str]]:
    """envoyproxy/ratelimit's response headers: the limit, what remains and the seconds until
    it resets, of the descriptor closest to its limit (the first with the least remaining)."""
    limited = [v for v in decision.verdicts if v.limit is not None]
    if not limited:
        return []
    closest = min(limited, key=lambda v: v.remaining)
    assert closest.limit is not None
    reset = max(0, -(-closest.reset_ms // 1000))
    values = (closest.limit.requests_per_unit, closest.remaining, reset)
    return [(name, str(value)) for name, value in zip(names, values, strict=True)]


def _policy_name(limit: RateLimit) -> str:
    name = limit.name or "default"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
