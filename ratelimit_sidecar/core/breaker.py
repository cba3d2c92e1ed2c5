"""The circuit breaker of strict checks: stop calling a store that keeps failing, for a while.

CLOSED: every check calls the store; `failures_to_open` failures in a row open it. OPEN: no call for
`open_ms`, strict rules apply `on_store_failure` at once (a dead store costs no timeout per
request); then one check goes through as a probe. HALF_OPEN: the probe's success closes, its failure
reopens; a probe that never reports (cancelled) is replaced after `open_ms`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_FAILURES_TO_OPEN = 3
DEFAULT_OPEN_MS = 1000


class BreakerState(enum.IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass(slots=True)
class Breaker:
    failures_to_open: int = DEFAULT_FAILURES_TO_OPEN
    open_ms: int = DEFAULT_OPEN_MS
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # in a row, while closed
    opened_at: int = 0
    probe_started: int = 0

    def allow(self, now_ms: int) -> bool:
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now_ms >= self.opened_at + self.open_ms:
            self.state, self.probe_started = BreakerState.HALF_OPEN, now_ms
            return True
        if self.state is BreakerState.HALF_OPEN and now_ms >= self.probe_started + self.open_ms:
            self.probe_started = now_ms  # the last probe never reported (its caller went away)
            return True
        return False

    def succeeded(self) -> None:
        self.state, self.failures = BreakerState.CLOSED, 0

    def failed(self, now_ms: int) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN or self.failures >= self.failures_to_open:
            self.state, self.opened_at = BreakerState.OPEN, now_ms

    def retry_in_ms(self, now_ms: int) -> int:
        if self.state is BreakerState.CLOSED:
            return 0
        return max(0, self.opened_at + self.open_ms - now_ms)
