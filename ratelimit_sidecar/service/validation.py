"""Bounds on what one ShouldRateLimit request may carry, checked before any work is done."""

from __future__ import annotations

from dataclasses import dataclass


class InvalidRequest(ValueError):
    """The message is the reason sent back."""


@dataclass(frozen=True, slots=True)
class Bounds:
    max_descriptors: int = 64
    max_entries: int = 16
    max_bytes: int = 1024  # per domain, entry key or entry value, in UTF-8 bytes

    def max_request_bytes(self) -> int:
        """The largest request these bounds accept, each field with room for its tag and
        length, and room for a descriptor's limit override and hits_addend: the gRPC port
        refuses a message announcing more before reading it."""
        field_bytes = self.max_bytes + 8
        descriptor = 64 + self.max_entries * (2 * field_bytes + 8)
        return 256 + field_bytes + self.max_descriptors * descriptor


DEFAULT_BOUNDS = Bounds()  # app/settings.py takes its defaults from here

Entries = list[tuple[str, str]]


def validate_request(domain: str, descriptors: int, bounds: Bounds) -> None:
    if not domain:
        raise InvalidRequest("rate limit domain must not be empty")
    if len(domain) * 4 > bounds.max_bytes and len(domain.encode()) > bounds.max_bytes:
        raise InvalidRequest(f"domain is longer than {bounds.max_bytes} bytes")
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    if descriptors > bounds.max_descriptors:
        raise InvalidRequest(
            f"{descriptors} descriptors, more than the {bounds.max_descriptors} allowed"
        )


def validate_entries(index: int, entries: Entries, bounds: Bounds) -> None:
    if not entries:
        raise InvalidRequest(f"descriptor {index} has no entries")
    if len(entries) > bounds.max_entries:
        raise InvalidRequest(
            f"descriptor {index} has {len(entries)} entries, "
            f"more than the {bounds.max_entries} allowed"
        )
    quarter = bounds.max_bytes // 4
    for key, value in entries:
        if not key:
            raise InvalidRequest(f"descriptor {index} has an entry with an empty key")
        # Character counts bound the byte counts from below: encode only when it could matter.
        if len(key) + len(value) > quarter and _too_long(key, value, bounds.max_bytes):
            raise InvalidRequest(
                f"descriptor {index}: entry {key[:64]!r} is longer than {bounds.max_bytes} bytes"
            )


def _too_long(key: str, value: str, limit: int) -> bool:
    return len(key.encode()) > limit or len(value.encode()) > limit
