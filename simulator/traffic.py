"""Offered load: when requests arrive and which node the load balancer hands each one to.

Arrivals are a Poisson process whose rate is piecewise constant. Traffic depends only on the
seed, never on decisions (clients do not retry), so every system compared in one scenario is
offered exactly the same requests.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from random import Random
from typing import Protocol


class RateSchedule(Protocol):
    def at(self, t: float) -> tuple[float, float]:
        """The rate (requests per ms) at `t` and when that rate next changes."""
        ...


@dataclass(frozen=True)
class Steady:
    per_ms: float

    def at(self, t: float) -> tuple[float, float]:  # noqa: ARG002 - the protocol's signature
        return self.per_ms, math.inf


@dataclass(frozen=True)
class Surge:
    """A quiet key (`quiet_per_ms`) that surges to `per_ms` at `at_ms` (a window's start) and
    stays there: the windows after a quiet one, where nothing showed the key near its limit."""

    per_ms: float
    quiet_per_ms: float
    at_ms: int

    def at(self, t: float) -> tuple[float, float]:
        if t < self.at_ms:
            return self.quiet_per_ms, self.at_ms
        return self.per_ms, math.inf


class Bursty:
    """Per window: a background at (1-f) of the average all along, plus f of the window's
    traffic packed into one burst of `burst_ms`, placed at random but inside the window.
    Each true window therefore carries the average on expectation, however peaky."""

    def __init__(  # noqa: PLR0917 - one constructor call site, each value named there
        self, per_ms: float, window_ms: int, burst_ms: int, fraction: float, start: int, rng: Random
    ) -> None:
        self._base = (1 - fraction) * per_ms
        self._peak = self._base + fraction * per_ms * window_ms / burst_ms
        self._window_ms, self._burst_ms, self._start, self._rng = window_ms, burst_ms, start, rng
        self._k = -1
        self._burst_at = 0

    def at(self, t: float) -> tuple[float, float]:
        k = int((t - self._start) // self._window_ms)
        window_start = self._start + k * self._window_ms
        if k != self._k:  # first visit of this window: place its burst
            self._k = k
            self._burst_at = window_start + self._rng.randrange(self._window_ms - self._burst_ms)
        if t < self._burst_at:
            return self._base, self._burst_at
        if t < self._burst_at + self._burst_ms:
            return self._peak, self._burst_at + self._burst_ms
        return self._base, window_start + self._window_ms


class Boundary:
    """Every other window end, `fraction` of two windows' traffic in one burst of `burst_ms`
    centred on it; the rest as a background all along. Half of each burst ends one window and
    half starts the next: the pattern that lets a fixed window admit up to 2 x MAX within one
    trailing window, and that a trailing-window rule must hold to MAX."""

    def __init__(
        self, per_ms: float, window_ms: int, burst_ms: int, fraction: float, start: int
    ) -> None:
        self._base = (1 - fraction) * per_ms
        self._peak = self._base + fraction * per_ms * 2 * window_ms / burst_ms
        self._period, self._half, self._start = 2 * window_ms, burst_ms // 2, start + window_ms

    def at(self, t: float) -> tuple[float, float]:
        k = (t - self._start + self._half) // self._period  # the last burst begun by t
        centre = self._start + k * self._period
        if t < centre + self._half:
            return self._peak, centre + self._half
        return self._base, centre + self._period - self._half


@dataclass(frozen=True)
class Change:
    """Node `node` joins (or leaves) the load balancer at true time `at_ms`."""

    at_ms: int
    node: int
    joins: bool


class Membership:
    """Which nodes serve when, and each one's load balancer weight."""

    def __init__(self, weights: tuple[float, ...], initial: int, changes: tuple[Change, ...]):
        self.weights = weights
        self.initial = initial
        self.changes = tuple(sorted(changes, key=lambda c: c.at_ms))
        self._times = [c.at_ms for c in self.changes]

    def active_at(self, t: float) -> list[int]:
        active = set(range(self.initial))
        for change in self.changes[: bisect.bisect_right(self._times, t)]:
            (active.add if change.joins else active.discard)(change.node)
        return sorted(active)

    def next_change(self, t: float) -> float:
        i = bisect.bisect_right(self._times, t)
        return self._times[i] if i < len(self._times) else math.inf

    def inverse_share(self, node: int, t: float) -> float:
        """What `nodes` should converge to for `node`: total weight over its own weight.

        The core's `nodes` is global / local traffic, i.e. the inverse of the node's share,
        which equals the node count only when the balancer splits evenly."""
        total = sum(self.weights[i] for i in self.active_at(t))
        return total / self.weights[node]


class Traffic:
    """The stream of (arrival time in ms, node index)."""

    def __init__(self, schedule: RateSchedule, membership: Membership, start: int, rng: Random):
        self._schedule, self._members, self._rng = schedule, membership, rng
        self._t = float(start)
        self._refresh_at = -math.inf
        self._nodes: list[int] = []
        self._cumulative: list[float] = []

    def next(self) -> tuple[int, int]:
        t = self._next_time()
        return int(t), self._pick(t)

    def _next_time(self) -> float:
        while True:
            rate, until = self._schedule.at(self._t)
            if rate > 0:
                t = self._t + self._rng.expovariate(rate)
                if t < until:  # memoryless: redrawing from a rate change is exact
                    self._t = t
                    return t
            self._t = until

    def _pick(self, t: float) -> int:
        if t >= self._refresh_at:
            self._nodes = self._members.active_at(t)
            weights = [self._members.weights[i] for i in self._nodes]
            self._cumulative = [sum(weights[: i + 1]) for i in range(len(weights))]
            self._refresh_at = self._members.next_change(t)
        if not self._nodes:
            raise ValueError("no node is serving")
        x = self._rng.random() * self._cumulative[-1]
        return self._nodes[bisect.bisect_right(self._cumulative, x)]
