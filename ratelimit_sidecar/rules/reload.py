"""Hot reload: watch the rule file or directory, rebuild aside, swap whole, keep the last good.

Polling (every 0.5 s) rather than inotify: no dependency, works on every filesystem, including
the symlink swaps Kubernetes does for mounted ConfigMaps, and stays well inside the 2 s budget.

Each load runs in its own daemon thread, not the loop's default executor: `asyncio.Runner`
joins that executor at exit, so a long load there would hold up shutdown, while a daemon thread
is simply left behind (its result, if any, is dropped). The loader stays within `ConfigLimits`
and pauses often, so requests keep being answered while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.limits import DEFAULT_LIMITS, ConfigLimits
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import DEFAULT_RULES, RuleDefaults, RuleSet
from ratelimit_sidecar.periodic import every

log = logging.getLogger("ratelimit_sidecar.reload")

POLL_S = 0.5
Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class RuleLoading:
    """How every rule source loads a rule set: within `limits`, with `defaults` for what the
    rules leave unsaid, its files (rules, or xDS TLS files) looked at every `poll_s`."""

    limits: ConfigLimits
    defaults: RuleDefaults
    poll_s: float


def fingerprint(path: Path) -> Fingerprint:
    """Name, mtime and size of every rule file: changes whenever a file is edited or swapped."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    seen = []
    for file in files:
        try:
            stat = file.stat()  # follows symlinks, so a ConfigMap swap is seen
        except OSError:
            continue
        seen.append((file.name, stat.st_mtime_ns, stat.st_size))
    return tuple(seen)


class RuleWatcher:
    """Calls `on_rules` with each new good rule set; `on_error` with each failed load."""

    def __init__(
        self,
        path: str,
        on_rules: Callable[[RuleSet], None],
        on_error: Callable[[str], None],
        poll_s: float = POLL_S,
        limits: ConfigLimits = DEFAULT_LIMITS,
        *,
        defaults: RuleDefaults = DEFAULT_RULES,
    ) -> None:
        self._path = Path(path)
        self._limits = limits
        self._defaults = defaults
        self._on_rules, self._on_error = on_rules, on_error
        self._poll_s = poll_s
        self._last = self._safe_fingerprint()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        async for _ in every(self._poll_s, self._stop):
            current = self._safe_fingerprint()
            if current != self._last:
                self._last = current
                await self.reload()

    async def reload(self) -> None:
        """Load the rules aside and hand them over; returns early, dropping the load, on stop."""
        abandoned = threading.Event()
        loading = load_in_thread(self._path, self._limits, abandoned, self._defaults)
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((loading, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not loading.done():  # stopping: end the load now, drop whatever it gives
                abandoned.set()
                loading.cancel()
        if not loading.cancelled():
            self._report(loading)

    def _report(self, loading: asyncio.Future[RuleSet]) -> None:
        error = loading.exception()
        if error is None:
            rules = loading.result()
            log.info("rules reloaded: version %s", rules.version)
            self._on_rules(rules)
        elif isinstance(error, ConfigError):
            log.error("rules not reloaded, keeping the last good ones:\n%s", error)
            self._on_error(str(error))
        else:  # unreadable, or a loader bug: keep the last good rules and keep watching
            log.error("rules not reloaded (%s), keeping the last good ones", error)
            self._on_error(str(error))

    def view(self) -> dict[str, object]:
        """Where the rules come from, for /debug/rules and /readyz."""
        return {"type": "file", "path": str(self._path), "ready": True}

    def _safe_fingerprint(self) -> Fingerprint:
        try:
            return fingerprint(self._path)
        except OSError:
            return ()


def load_in_thread(
    path: Path,
    limits: ConfigLimits,
    abandoned: threading.Event,
    defaults: RuleDefaults = DEFAULT_RULES,
) -> asyncio.Future[RuleSet]:
    """`load_rules` in a new daemon thread; its outcome arrives in the returned future.

    Setting `abandoned` ends the load within a millisecond, so an abandoned load neither keeps
    a core busy nor leaves its half-built tree for the interpreter to clear at exit.
    """
    return in_daemon_thread(partial(load_rules, path, limits, abandoned.is_set, defaults))


def in_daemon_thread(work: Callable[[], RuleSet]) -> asyncio.Future[RuleSet]:
    """`work()` in a new daemon thread (a rule load); its outcome arrives in the future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[RuleSet] = loop.create_future()

    def load() -> None:
        try:
            rules = work()
        except Exception as exc:
            _hand_over(loop, future, partial(future.set_exception, exc))
        else:
            _hand_over(loop, future, partial(future.set_result, rules))

    threading.Thread(target=load, name="rule-loader", daemon=True).start()
    return future


def _hand_over(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[RuleSet], settle: Callable[[], None]
) -> None:
    """Run `settle` on the loop, unless the future was given up on or the loop is gone."""

    def settle_if_waited() -> None:
        if not future.done():
            settle()

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle_if_waited)
