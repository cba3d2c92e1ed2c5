"""What the benchmarks send (the bench rule, ShouldRateLimit bodies), and the handler in-process
measurements decide with.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.h2raw import grpc_message
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

DOMAIN = "bench"
KEY = "client"
UNREACHABLE = 1_000_000_000  # per second: no run comes near it, every answer is OK


def rules_yaml(
    requests_per_unit: int = UNREACHABLE,
    extra: str = "",
    *,
    domain: str = DOMAIN,
    key: str = KEY,
    unit: str = "second",
) -> str:
    """The bench rule: value-less `client`, one limit per second; `extra` adds fields to it
    (e.g. "consistency: strict"); other sections' rules name their own domain, key and unit."""
    fields = f"unit: {unit}, requests_per_unit: {requests_per_unit}"
    return (
        f"domain: {domain}\ndescriptors:\n  - key: {key}\n"
        f"    rate_limit: {{{fields}{', ' + extra if extra else ''}}}\n"
    )


# Every workload hits this rule unless a section says otherwise: a limit far above any rate.
RULES_YAML = rules_yaml()


@dataclass(frozen=True, slots=True)
class Workload:
    """Request bodies (gRPC frames) that a load generator sends round-robin."""

    name: str
    frames: Sequence[bytes]


def request(value: str, domain: str = DOMAIN, key: str = KEY) -> wire.RateLimitRequest:
    """One descriptor `key=value`, as Envoy would send it."""
    message = wire.RateLimitRequest(domain=domain)
    message.descriptors.add().entries.add(key=key, value=value)
    return message


def key_values(count: int, prefix: str = "c") -> list[str]:
    width = len(str(count - 1))
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def unframe(frame: bytes) -> bytes:
    flag, length = struct.unpack(">BI", frame[:5])
    if flag != 0 or length != len(frame) - 5:
        raise ValueError("not one uncompressed gRPC frame")
    return frame[5:]


def workload(name: str, values: Iterable[str]) -> Workload:
    return Workload(name, [grpc_message(request(v).SerializeToString()) for v in values])


def hot_10() -> Workload:
    return workload("hot-10", key_values(10))


def rules_dir(workdir: Path, text: str = RULES_YAML, name: str = DOMAIN) -> Path:
    """A rules directory holding one file, for `serve --config` (one per `name` in `workdir`)."""
    directory = workdir / f"rules-{name}"
    directory.mkdir(exist_ok=True)
    (directory / "rules.yaml").write_text(text)
    return directory


def bench_rules(text: str = RULES_YAML) -> RuleSet:
    """`text` loaded as `serve` would."""
    with tempfile.TemporaryDirectory(prefix="rls-bench-rules-") as tmp:
        return load_rules(rules_dir(Path(tmp), text))


def handler(max_keys: int, clock_ms: Callable[[], int], metrics: Metrics) -> RateLimitHandler:
    """The server's request handler for the bench rule, local-only (as `serve` runs without
    Redis), caching as many compiled requests as the limiter tracks keys."""
    limiter = LocalLimiter(max_keys)
    return RateLimitHandler(
        bench_rules(), limiter, clock_ms, observer=metrics, cache_entries=max_keys
    )
