"""Building ShouldRateLimit requests and calling a server, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.wrappers_pb2 import UInt64Value

from ratelimit_sidecar._proto import wire

Entries = Sequence[tuple[str, str]]


def request(
    domain: str,
    *descriptors: Entries,
    hits_addend: int = 0,
    descriptor_hits: Sequence[int | None] | None = None,
) -> wire.RateLimitRequest:
    message = wire.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for index, entries in enumerate(descriptors):
        descriptor = message.descriptors.add()
        for key, value in entries:
            descriptor.entries.add(key=key, value=value)
        own = descriptor_hits[index] if descriptor_hits else None
        if own is not None:
            descriptor.hits_addend.CopyFrom(UInt64Value(value=own))
    return message


def rls_stub(channel: grpc.Channel) -> Any:
    """A RateLimitService client on `channel` (the generated stub class has no type hints)."""
    return wire.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
