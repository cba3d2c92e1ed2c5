"""A domain `d` with one strict and one eventual limit per minute, and a handler deciding it on a
local limiter at a fixed clock: what the strict handler's and the servicer's tests share."""

from __future__ import annotations

from pathlib import Path

from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.strict import StrictChecker, StrictDecider

T0 = 1_700_000_040_000


def strict_handler(
    tmp_path: Path, store: StrictChecker | None, strict_max: int, eventual_max: int, timeout_ms: int
) -> RateLimitHandler:
    """`store` None: no strict decider (local-only mode)."""
    (tmp_path / "d.yaml").write_text(
        "domain: d\ndescriptors:\n"
        "  - key: strict\n"
        f"    rate_limit: {{unit: minute, requests_per_unit: {strict_max}, consistency: strict}}\n"
        "  - key: eventual\n"
        f"    rate_limit: {{unit: minute, requests_per_unit: {eventual_max}}}\n"
    )
    limiter = LocalLimiter()
    decider = None if store is None else StrictDecider(limiter, store, timeout_ms=timeout_ms)
    return RateLimitHandler(load_rules(tmp_path / "d.yaml"), limiter, lambda: T0, strict=decider)
