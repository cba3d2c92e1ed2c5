"""ShouldRateLimit request bodies as gRPC length-prefixed frames, the bytes load generators send."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from ratelimit_sidecar import wire

DOMAIN = "bench"
KEY = "client"

# The rule every workload hits: value-less `client`, a limit far above any reachable rate.
RULES_YAML = f"""\
domain: {DOMAIN}
descriptors:
  - key: {KEY}
    rate_limit: {{unit: second, requests_per_unit: 1000000000}}
"""


def request(value: str) -> wire.RateLimitRequest:
    """One descriptor `client=<value>` in the bench domain (as Envoy would send it)."""
    message = wire.RateLimitRequest(domain=DOMAIN)
    message.descriptors.add().entries.add(key=KEY, value=value)
    return message


def key_values(count: int) -> list[str]:
    width = len(str(count - 1))
    return [f"c{i:0{width}d}" for i in range(count)]


def grpc_frame(message: bytes) -> bytes:
    """gRPC message framing: compressed flag 0, 4-byte big-endian length, the message."""
    return struct.pack(">BI", 0, len(message)) + message


def unframe(frame: bytes) -> bytes:
    flag, length = struct.unpack(">BI", frame[:5])
    if flag != 0 or length != len(frame) - 5:
        raise ValueError("not one uncompressed gRPC frame")
    return frame[5:]


def frames_for(values: Iterable[str]) -> list[bytes]:
    return [grpc_frame(request(v).SerializeToString()) for v in values]


def write_frames(path: Path, frames: list[bytes]) -> Path:
    """All frames back to back (self-delimiting): the Node client's input, or h2load's `-d`."""
    path.write_bytes(b"".join(frames))
    return path
