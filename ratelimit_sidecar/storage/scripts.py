"""The Lua scripts the Redis stores run: loaded one way, called by SHA1, NOSCRIPT handled here.

A script names the files it includes on a first line of its own, `-- include: a.lua b.lua`:
the loader puts their sources in front of it, in that order (a script calls their functions).
The numbers and markers the Python side owns (a penalty's grace, an error answer's prefix) are
written `{{NAME}}` in a script and filled in from `CONSTANTS`, so they have one home.

Calls go by EVALSHA: one round trip, the script's text sent once. A server that does not know
the script (after a restart or SCRIPT FLUSH) answers NOSCRIPT without running anything, so the
call is safe to send again as EVAL, which also caches the script for the next EVALSHA. (redis-py's
`Script` objects would send SCRIPT EXISTS before every pipeline: two round trips per sync.)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from ratelimit_sidecar.core.penalty import MAX_GRACE_MS, MAX_LEVELS
from ratelimit_sidecar.core.quiet_keys import NEAR_SHARE

KEY_ERROR = "E:"  # a sync script's answer for a key it applied nothing for, before the reason
MAX_REASON = 80  # characters of an error reply kept as a key's reason
CONSTANTS: dict[str, object] = {
    "KEY_ERROR": KEY_ERROR,
    "MAX_REASON": MAX_REASON,
    "MAX_GRACE_MS": MAX_GRACE_MS,
    "MAX_LEVELS": MAX_LEVELS,
    "NEAR_SHARE": NEAR_SHARE,
}
_INCLUDE = re.compile(r"^-- include: ((?:[\w.]+\.lua ?)+)$", re.MULTILINE)
_CONSTANT = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str  # with its includes in front and the constants filled in
    sha: str

    def evalsha(self, *args: Any) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, *args)

    def eval(self, *args: Any) -> tuple[Any, ...]:
        """The same call with the script's text (after a NOSCRIPT answer)."""
        return ("EVAL", self.source, *args)


def load(name: str) -> Script:
    """A packaged script, with what it includes and the constants filled in."""
    own = _text(name)
    included = [_text(part) for line in _INCLUDE.findall(own) for part in line.split()]
    source = _CONSTANT.sub(lambda m: str(CONSTANTS[m.group(1)]), "\n".join([*included, own]))
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


def not_loaded(reply: object) -> bool:
    """A NOSCRIPT answer (raised, or an error reply in a pipeline's replies): nothing ran."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
    )


async def call(execute: Callable[..., Awaitable[Any]], script: Script, *args: Any) -> Any:
    """One script call through `execute` (a client's `execute_command`, or a wrapper of it),
    sent again as EVAL if the server did not know the script."""
    try:
        return await execute(*script.evalsha(*args))
    except Exception as exc:
        if not not_loaded(exc):
            raise
    return await execute(*script.eval(*args))


def _text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
