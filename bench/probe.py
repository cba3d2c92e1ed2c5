"""Correctness probe: the exact bodies a load run sends must get gRPC OK with overall_code OK.

h2load counts HTTP 200 as success even when the gRPC status (in the trailers) is an error, so
every timed run is preceded by this check with a real gRPC client.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from bench.frames import unframe
from ratelimit_sidecar import wire

PROBE_SAMPLES = 20


class ProbeFailed(RuntimeError):
    """A body the load generator would send is not answered with OK."""


def sample(frames: Sequence[bytes], count: int = PROBE_SAMPLES) -> list[bytes]:
    """Every frame when there are few, else `count` spread evenly (first and last included)."""
    if len(frames) <= count:
        return list(frames)
    step = (len(frames) - 1) / (count - 1)
    return [frames[round(i * step)] for i in range(count)]


def probe(address: str, frames: Sequence[bytes]) -> int:
    """Send each sampled body as-is; returns how many were checked, raises ProbeFailed."""
    checked = sample(frames)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            wire.METHOD_PATH,
            request_serializer=None,  # the bytes go out exactly as the load generator sends them
            response_deserializer=wire.RateLimitResponse.FromString,
        )
        for frame in checked:
            try:
                reply = call(unframe(frame), timeout=5.0)
            except grpc.RpcError as exc:
                raise ProbeFailed(f"{address}: gRPC error {exc.code()}: {exc.details()}") from exc
            if reply.overall_code != wire.Code.OK:
                code = wire.Code.Name(reply.overall_code)
                raise ProbeFailed(f"{address}: overall_code {code}, expected OK")
    return len(checked)
