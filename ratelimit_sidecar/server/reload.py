"""Hot reload: watch the rule file or directory, rebuild aside, swap whole, keep the last good.

Polling (every 0.5 s) rather than inotify: no dependency, works on every filesystem, including
the symlink swaps Kubernetes does for mounted ConfigMaps, and stays well inside the 2 s budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import RuleSet

log = logging.getLogger("ratelimit_sidecar.reload")

POLL_S = 0.5
Fingerprint = tuple[tuple[str, int, int], ...]


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
    ) -> None:
        self._path = Path(path)
        self._on_rules, self._on_error = on_rules, on_error
        self._poll_s = poll_s
        self._last = self._safe_fingerprint()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self._poll_s)
                return
            except TimeoutError:
                pass
            current = self._safe_fingerprint()
            if current != self._last:
                self._last = current
                await self.reload()

    async def reload(self) -> None:
        try:
            rules = await asyncio.to_thread(load_rules, self._path)
        except ConfigError as exc:
            log.error("rules not reloaded, keeping the last good ones:\n%s", exc)
            self._on_error(str(exc))
        except OSError as exc:
            log.error("rules not reloaded (%s), keeping the last good ones", exc)
            self._on_error(str(exc))
        else:
            log.info("rules reloaded: version %s", rules.version)
            self._on_rules(rules)

    def _safe_fingerprint(self) -> Fingerprint:
        try:
            return fingerprint(self._path)
        except OSError:
            return ()
