"""Bounds on what one ShouldRateLimit request may carry, checked before any work is done."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ratelimit_sidecar.wire import Entry, RateLimitRequest


class InvalidRequest(ValueError):
    """The request cannot be answered; the message is the reason sent back to the caller."""


@dataclass(frozen=True, slots=True)
class Bounds:
    max_descriptors: int = 64
    max_entries: int = 16
    max_bytes: int = 1024  # per domain, entry key or entry value, in UTF-8 bytes


def validate(request: RateLimitRequest, bounds: Bounds) -> None:
    """Raise InvalidRequest with a reason for an empty or oversized request."""
    if not request.domain:
        raise InvalidRequest("rate limit domain must not be empty")
    if len(request.domain.encode()) > bounds.max_bytes:
        raise InvalidRequest(f"domain is longer than {bounds.max_bytes} bytes")
    descriptors = request.descriptors
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    if len(descriptors) > bounds.max_descriptors:
        raise InvalidRequest(
            f"{len(descriptors)} descriptors, more than the {bounds.max_descriptors} allowed"
        )
    for index, descriptor in enumerate(descriptors):
        _validate_entries(index, descriptor.entries, bounds)


def _validate_entries(index: int, entries: Sequence[Entry], bounds: Bounds) -> None:
    if not entries:
        raise InvalidRequest(f"descriptor {index} has no entries")
    if len(entries) > bounds.max_entries:
        raise InvalidRequest(
            f"descriptor {index} has {len(entries)} entries, "
            f"more than the {bounds.max_entries} allowed"
        )
    for entry in entries:
        if not entry.key:
            raise InvalidRequest(f"descriptor {index} has an entry with an empty key")
        # Character counts bound the byte counts from below: encode only when it could matter.
        if len(entry.key) + len(entry.value) > bounds.max_bytes // 4 and _too_long(entry, bounds):
            raise InvalidRequest(
                f"descriptor {index}: entry {entry.key[:64]!r} is longer than "
                f"{bounds.max_bytes} bytes"
            )


def _too_long(entry: Entry, bounds: Bounds) -> bool:
    limit = bounds.max_bytes
    return len(entry.key.encode()) > limit or len(entry.value.encode()) > limit
