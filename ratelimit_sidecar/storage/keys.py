"""Redis key names for counters, block flags and the node heartbeat: the schema, the digest and
why a collision is harmless are in docs/OPERATIONS.md ("What the sidecar keeps in Redis").
A counter is `<prefix>{<digest>}:<domain>:<keys>:<suffix>`: the digest alone identifies it and
is the Cluster hash tag; the names are for operators; descriptor values are never in clear.
Nor are they in the debug views, which show each value as its own short digest (`value_digest`).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from ratelimit_sidecar.core.types import KeyId

DEFAULT_PREFIX = "rls:"
DIGEST_HEX = 16
MAX_DOMAIN = 24
MAX_KEYS = 40
MAX_PREFIX = 64
# Bumped if the encoding below ever changes, so old and new counters never alias.
_VERSION = b"rls1"
_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")


@lru_cache(maxsize=1 << 18)
def digest(key: KeyId) -> str:
    chunks = [_VERSION]
    for part in key:
        # surrogatepass: a lone surrogate must not make key naming fail on the sync path.
        raw = part.encode("utf-8", "surrogatepass")
        chunks += (len(raw).to_bytes(8, "big"), raw)
    return hashlib.blake2b(b"".join(chunks), digest_size=DIGEST_HEX // 2).hexdigest()


def value_digest(value: str) -> str:
    """A descriptor value as `#` + 12 hex digits: enough to tell values apart, not to read them.
    How the debug views (/debug/keys, /debug/rules' overrides) show a value by default."""
    raw = value.encode("utf-8", "surrogatepass")
    return "#" + hashlib.blake2b(raw, digest_size=6, person=b"rls-debug").hexdigest()


def readable(text: str, limit: int) -> str:
    return _UNSAFE.sub("_", text[:limit]) or "_"


def counter_suffix(key: KeyId, window: int | str) -> str:
    """`:<domain>:<keys>:<window>` (or another algorithm's part in place of the window)."""
    domain = readable(key[0], MAX_DOMAIN) if key else "_"
    return f":{domain}:{_names(key[1::2])}:{window}"


def span_suffix(key: KeyId, span: int) -> str:
    return f"{span_stem(key)}{span}"


def span_stem(key: KeyId) -> str:
    """The sync script appends span numbers."""
    return counter_suffix(key, "s")


def bucket_suffix(key: KeyId) -> str:
    return counter_suffix(key, "tb")


@lru_cache(maxsize=1 << 12)
def _names(keys: tuple[str, ...]) -> str:
    return readable(".".join(keys), MAX_KEYS)


class KeySchema:
    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if "{" in prefix or "}" in prefix:
            # A brace in the prefix would become the cluster hash tag instead of the digest.
            raise ValueError(f"redis key prefix must not contain '{{' or '}}': {prefix!r}")
        if len(prefix) > MAX_PREFIX or any(c.isspace() or not c.isprintable() for c in prefix):
            raise ValueError(
                f"redis key prefix must be at most {MAX_PREFIX} printable characters "
                f"without spaces: {prefix!r}"
            )
        self.prefix = prefix

    def tag(self, key: KeyId) -> str:
        return f"{self.prefix}{{{digest(key)}}}"

    def counter(self, key: KeyId, window: int) -> str:
        return f"{self.tag(key)}{counter_suffix(key, window)}"

    def flag(self, key: KeyId) -> str:
        return f"{self.tag(key)}:block"

    def nodes(self) -> str:
        return f"{self.prefix}nodes"

    def overrides(self, part: str) -> str:
        """`part`: "set", "version" or "history"; `{overrides}` is never a (hex) digest."""
        return f"{self.prefix}{{overrides}}:{part}"

    def channel(self, name: str) -> str:
        return f"{self.prefix}events:{name}"
