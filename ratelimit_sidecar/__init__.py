"""ratelimit-sidecar: Envoy's rate limit service, answered from local memory, synced via Redis."""

from __future__ import annotations

__version__ = "0.1.0"
