"""The gRPC port's bounds, each with its default (docs/TRANSPORT.md says why each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from ratelimit_sidecar.grpc_server.protocol.limits import Limits

MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class PortOptions:
    """The gRPC port's bounds (flags in app/settings.py; docs/TRANSPORT.md says why each)."""

    limits: Limits = field(default_factory=Limits)  # per connection: the protocol core's
    pending_bytes: int = 64 * MIB  # request octets buffered unfinished, the whole process
    max_connections: int = 0  # 0: below the descriptor limit (admission.py)
    max_connections_per_peer: int = 256
    tls_handshake_timeout_s: float = 10.0
    max_age: tuple[float, float] | None = None  # seconds a connection lives, then grace


PORT_DEFAULTS: Final = PortOptions()
