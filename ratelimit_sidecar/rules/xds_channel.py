"""What an xDS client needs besides the stream: its options, Node, channel, and when to retry.

The TLS files are read again for each new channel, so a rotated certificate is used from the
next connection on; a change of `TlsFiles.fingerprint` tells the client to make that connection
now.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.struct_pb2 import Struct

from ratelimit_sidecar._proto.envoy.config.core.v3 import base_pb2

USER_AGENT = "ratelimit-sidecar"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a whole rule set comes in one response
KEEPALIVE_MS = 330_000


@dataclass(frozen=True, slots=True)
class XdsOptions:
    """The control plane rules come from (`--config-xds-*`): who this node says it is, how it
    connects, how it retries, and whether /readyz waits for a first configuration."""

    url: str
    node_id: str
    node_metadata: str  # `key=value,key=value`, as the reference reads it
    tls: TlsFiles | None  # None: plaintext
    retry_s: float  # the first reconnect delay; doubles per failed attempt up to `retry_max_s`
    retry_max_s: float
    ready_without_config: bool


def node_of(options: XdsOptions) -> base_pb2.Node:
    """The Node the control plane serves: id and `key=value,key=value` metadata, as the
    reference service reads them (an entry without `=` is skipped)."""
    metadata = Struct()
    for entry in options.node_metadata.split(","):
        key, sep, value = entry.partition("=")
        if sep and key.strip():
            metadata.update({key.strip(): value.strip()})
    node = base_pb2.Node(id=options.node_id, user_agent_name=USER_AGENT)
    node.metadata.CopyFrom(metadata)
    return node


class Backoff:
    """Delays between connection attempts: doubling from `initial_s` up to `max_s`, each drawn
    at random from its upper half ("equal jitter"), so that a fleet restarted together does not
    reconnect together, and never less than half of `initial_s`: no busy loop."""

    def __init__(
        self, initial_s: float, max_s: float, rng: Callable[[], float] = random.random
    ) -> None:
        self.initial_s, self.max_s = initial_s, max_s
        self._rng = rng
        self.failures = 0  # attempts since the last one that got a response

    def next_delay(self) -> float:
        ceiling = min(self.max_s, self.initial_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return ceiling / 2 + self._rng() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The mTLS files of `--config-xds-client-tls`; None fields fall back to gRPC's defaults."""

    cert: Path | None
    key: Path | None
    ca: Path | None
    san: str | None

    def fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Modification time and size of each file ((0, 0) if absent): a rotation changes it."""
        seen = []
        for path in (self.cert, self.key, self.ca):
            try:
                stat = path.stat() if path is not None else None
            except OSError:
                stat = None
            seen.append((stat.st_mtime_ns, stat.st_size) if stat is not None else (0, 0))
        return tuple(seen)

    def credentials(self) -> grpc.ChannelCredentials:
        """Read now, so a new channel uses the files as they are now; OSError if unreadable."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca),
            private_key=_read(self.key),
            certificate_chain=_read(self.cert),
        )


def open_channel(url: str, tls: TlsFiles | None) -> grpc.aio.Channel:
    """A new channel per stream attempt: its one connection attempt is paced by `Backoff`."""
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.primary_user_agent", USER_AGENT),
        # A control plane that vanished without closing the stream is found by pings, spaced
        # beyond gRPC servers' default 5-minute minimum so they are not refused as abuse.
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]
    if tls is None:
        return grpc.aio.insecure_channel(url, options=options)
    if tls.san:
        options.append(("grpc.ssl_target_name_override", tls.san))
    return grpc.aio.secure_channel(url, tls.credentials(), options=options)


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None
