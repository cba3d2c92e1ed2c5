"""The one settings object of a sidecar process, filled from flags and environment variables."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from ratelimit_sidecar.core import DEFAULT_MAX_KEYS

ENV_PREFIX = "RLS_"


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Settings:
    config_path: str
    redis_url: str | None = None
    grpc_address: str = "127.0.0.1:8081"
    metrics_address: str = "127.0.0.1:9090"
    node_id: str = field(default_factory=default_node_id)
    workers: int = 1
    shadow_mode: bool = False
    log_format: str = "text"
    log_level: str = "info"
    ietf_headers: bool = False
    max_keys: int = DEFAULT_MAX_KEYS
    max_descriptors: int = 64
    max_entries: int = 16
    max_value_bytes: int = 1024
    redis_prefix: str = "rls:"
    sync_timeout_ms: int = 250
    shutdown_grace_s: float = 5.0
    reload_poll_s: float = 0.5

    @property
    def local_only(self) -> bool:
        return not self.redis_url
