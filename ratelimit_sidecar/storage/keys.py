"""Redis key names for counters, block flags and the node heartbeat.

Schema (with the default prefix `rls:`)::

    rls:{<digest>}:<domain>:<keys>:<window>   a window's counter (INCRBY, TTL 2 windows); every
                                              algorithm's pushes count there (nodes estimate)
    rls:{<digest>}:<domain>:<keys>:s<span>    sliding window: a span's counter, numbered from the
                                              epoch (INCRBY, TTL one window + 2 spans)
    rls:{<digest>}:<domain>:<keys>:tb         token bucket: its TAT, epoch ms with 3 decimals on
                                              Redis TIME (TTL until the bucket is full)
    rls:{<digest>}:<domain>:<keys>:log        sliding log (strict only): admitted requests by
                                              epoch ms (sorted set, TTL one window)
    rls:{<digest>}:block                      shared block flag (SET NX PX cooldown)
    rls:nodes                                 heartbeat sorted set: node id -> last sync ms
    rls:{overrides}:set|version|history       runtime overrides (storage/overrides_redis.py)

`<digest>` is 16 hex digits of BLAKE2b over the whole KeyId, every part length-prefixed (no
separator inside a value can make two tuples encode alike). It alone identifies a counter, and is
the Cluster hash tag: a key's counters and flag share a slot (the push script touches both).

`<domain>` and `<keys>` (descriptor key names joined with `.`) are for operators scanning Redis:
cut short, every character outside `[A-Za-z0-9_./-]` made `_`, so never `:`, `{`, `}`, spaces or
control characters. Descriptor *values* are never written in clear (API keys, user ids...).

Two KeyIds share a counter only if their 64-bit digests collide: about n^2 / 2^65 for n live
keys (1e-6 for 6 million); on purpose, a second preimage (2^64 work), as a birthday collision of
an attacker's own keys only merges their own counters. Length: len(prefix) + at most 100.
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
        chunks.append(len(raw).to_bytes(8, "big"))
        chunks.append(raw)
    return hashlib.blake2b(b"".join(chunks), digest_size=DIGEST_HEX // 2).hexdigest()


def readable(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("_", text[:limit])
    return cleaned or "_"


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
