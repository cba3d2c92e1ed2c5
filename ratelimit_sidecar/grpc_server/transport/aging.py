"""A connection's maximum age (`--grpc-max-connection-age-s`): GOAWAY when it is that old, so
its client reconnects and resolves the service's name again, then cut after the grace."""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

from ratelimit_sidecar.grpc_server.protocol import frames as f

SPREAD = 0.1  # ±10 % of the age: clients connected together do not reconnect together


class Drainable(Protocol):
    def goaway(self) -> None: ...

    def fail(self, code: int, reason: str) -> None: ...


class Aging:
    """The timer of one connection's age, then of its grace; `cancel` when it ends."""

    def __init__(self, conn: Drainable, age_s: float, grace_s: float) -> None:
        self._conn, self._grace_s = conn, grace_s
        lifetime = age_s * random.uniform(1 - SPREAD, 1 + SPREAD)
        self._timer = asyncio.get_running_loop().call_later(lifetime, self._aged)

    def _aged(self) -> None:
        self._conn.goaway()
        self._timer = asyncio.get_running_loop().call_later(
            self._grace_s, self._conn.fail, f.NO_ERROR, "max connection age"
        )

    def cancel(self) -> None:
        self._timer.cancel()
