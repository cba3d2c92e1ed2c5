"""The Lua scripts the Redis stores run: loaded one way, called by SHA1, NOSCRIPT handled here.

A script's line `-- include: a.lua b.lua` puts those sources in front of it; `{{NAME}}` is filled
from `CONSTANTS`, so numbers the Python side owns have one home. Calls go by EVALSHA; a server
that lost the script answers NOSCRIPT having run nothing, so the call is sent again as EVAL,
which caches it. (redis-py's `Script` sends SCRIPT EXISTS before every pipeline: two round trips
per sync.)
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
        """After a NOSCRIPT answer."""
        return ("EVAL", self.source, *args)


def load(name: str) -> Script:
    own = _text(name)
    included = [_text(part) for line in _INCLUDE.findall(own) for part in line.split()]
    source = _CONSTANT.sub(lambda m: str(CONSTANTS[m.group(1)]), "\n".join([*included, own]))
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


def not_loaded(reply: object) -> bool:
    """Raised, or an error reply in a pipeline's replies: nothing ran."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
    )


async def call(execute: Callable[..., Awaitable[Any]], script: Script, *args: Any) -> Any:
    """Through `execute` (a client's `execute_command`, or a wrapper); EVAL if NOSCRIPT."""
    try:
        return await execute(*script.evalsha(*args))
    except Exception as exc:
        if not not_loaded(exc):
            raise
    return await execute(*script.eval(*args))


def _text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
