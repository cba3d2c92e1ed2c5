"""Bounds on what loading a rule set may cost, so a hostile or huge file is refused, not chewed
on.

Each is checked as early as it can be: sizes by `stat` before reading (and while reading: the
file may grow), YAML nodes while composing (an alias counts its whole node), descriptors while
building. The field names are the `Settings` options' (`--max-rule-file-bytes`, ...).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import Problem

MIB = 1024 * 1024
# The composer and tree builder recurse per level; real files nest a handful of levels.
MAX_YAML_DEPTH = 100
# A load beside the request path pauses this often (see `Pacer`).
PAUSE_EVERY_S = 0.001


@dataclass(frozen=True, slots=True)
class ConfigLimits:
    max_rule_file_bytes: int = 4 * MIB
    max_rule_dir_bytes: int = 16 * MIB
    max_rule_descriptors: int = 100_000
    max_yaml_nodes: int = 1_000_000

    @classmethod
    def of(cls, source: object) -> ConfigLimits:
        """From `source`'s attributes of the same names (e.g. `Settings`)."""
        return cls(**{spec.name: getattr(source, spec.name) for spec in fields(cls)})


DEFAULT_LIMITS = ConfigLimits()
LIMIT_NAMES = tuple(spec.name for spec in fields(ConfigLimits))


def option(name: str) -> str:
    return f"--{name.replace('_', '-')} / RLS_{name.upper()}"


class LimitExceeded(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def too_big(file: Path, size: int, limit: int) -> Problem:
    message = (
        f"{size} bytes is more than the limit of {limit} bytes per rule file"
        f" (raise it with {option('max_rule_file_bytes')})"
    )
    return Problem(str(file), 0, "file", message)


def read_bounded(file: Path, limit: int) -> bytes:
    """`LimitExceeded` past `limit` (stat, then a read of at most `limit + 1`: a growing file
    too)."""
    size = file.stat().st_size
    if size > limit:
        raise LimitExceeded(too_big(file, size, limit))
    with file.open("rb") as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise LimitExceeded(too_big(file, len(data), limit))
    return data


def check_total_size(directory: Path, files: list[Path], limit: int) -> None:
    total = 0
    for file in files:
        try:
            total += file.stat().st_size
        except OSError:
            continue  # reported when the file is read
    if total > limit:
        message = (
            f"the rule files total {total} bytes, more than the limit of {limit} bytes"
            f" (raise it with {option('max_rule_dir_bytes')})"
        )
        raise LimitExceeded(Problem(str(directory), 0, "file", message))


class LoadStopped(Exception):
    """The load was given up on; nothing was loaded."""


def never_stopped() -> bool:
    return False


class Pacer:
    """Pauses about every `PAUSE_EVERY_S`, and ends the load there once `stopped()`. CPython
    takes the interpreter from a busy thread only after its switch interval (5 ms): without
    pauses each step of a request behind a long load could wait that long."""

    __slots__ = ("_next", "_stopped")

    def __init__(self, stopped: Callable[[], bool] = never_stopped) -> None:
        self._stopped = stopped
        self._next = time.perf_counter() + PAUSE_EVERY_S

    def tick(self) -> None:
        if time.perf_counter() >= self._next:
            time.sleep(0)
            if self._stopped():
                raise LoadStopped
            self._next = time.perf_counter() + PAUSE_EVERY_S


class _CollectorPause:
    """The cyclic collector stays off while any load runs: a load makes up to a million
    containers, and each full collection walks them all with every thread stopped (0.9 s for a 4
    MiB file). A load frees its own garbage by reference counting; after the last one, collection
    walks only the new rule set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads = 0
        self._was_enabled = False

    @contextmanager
    def during_load(self) -> Iterator[None]:
        with self._lock:
            if self._loads == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._loads += 1
        try:
            yield
        finally:
            with self._lock:
                self._loads -= 1
                if self._loads == 0 and self._was_enabled:
                    gc.enable()


collector_paused = _CollectorPause().during_load


class DescriptorBudget:
    """Descriptors across every file of one load."""

    __slots__ = ("_left", "_limit", "pacer")

    def __init__(self, limit: int, pacer: Pacer) -> None:
        self._limit = self._left = limit
        self.pacer = pacer

    def take(self, file: str, line: int, key: str) -> None:
        self.pacer.tick()
        self._left -= 1
        if self._left < 0:
            message = (
                f"more than {self._limit} descriptors in the rule set"
                f" (raise the limit with {option('max_rule_descriptors')})"
            )
            raise LimitExceeded(Problem(file, line, key, message))
