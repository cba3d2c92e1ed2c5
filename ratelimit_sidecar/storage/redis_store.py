"""The shared store on Redis (standalone, Sentinel or Cluster), one pipeline per span end.

`RedisStorage.sync` turns a `SyncBatch` into one non-transactional pipeline: one `sync.lua`
call per chunk of up to 1000 pushes (per hash slot on Cluster), `PTTL` per FlagRead, `GET` per
TotalRead, then the node heartbeat. Script arguments and answers are packed strings, because
redis-py encodes and parses in Python: one value per call instead of six per key keeps a 100k
key sync well inside a span. On Cluster, redis-py splits the pipeline by node and sends the
parts concurrently: one round trip per Redis node. Semantics are those of `MemoryStorage`; the
key names are in `keys.py`.

Nothing here retries: a retried INCRBY could count a span twice, and a stalled sync is worse
than a failed one because the caller times it out and falls back to local thresholds. Sockets
therefore get short timeouts (0.25 s) unless the URL says otherwise.

URL forms accepted by `open_redis` (query parameters are redis-py connection options, e.g.
`socket_timeout=0.5`, `ssl_cert_reqs=none`, `ssl_ca_certs=/path/ca.pem`, `ssl_certfile=`...):

    redis://[user:password@]host:port[/db]         rediss://...   (TLS)
    unix://[user:password@]/path/to/socket.sock[?db=N]
    redis+cluster://[user:password@]host:port[,host:port...]       rediss+cluster://... (TLS)
    redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]
                                                                   rediss+sentinel://... (TLS)

For Sentinel, user and password are those of the data nodes; `sentinel_username` and
`sentinel_password` query parameters authenticate to the sentinels themselves.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import unquote

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ratelimit_sidecar.core.types import Push, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.storage.keys import (
    DEFAULT_PREFIX,
    KeySchema,
    counter_suffix,
    digest,
    readable,
)

SYNC_SCRIPT = resources.files(__package__).joinpath("sync.lua").read_text(encoding="utf-8")
SYNC_SHA = hashlib.sha1(SYNC_SCRIPT.encode("utf-8")).hexdigest()
THREAD_ABOVE = 2000  # pushes in a batch above which packing and parsing leave the loop
CHUNK_KEYS = 1000  # keys per script call: big enough to amortise, small enough not to stall Redis
DEFAULT_NODE_TTL_MS = 30_000
T = TypeVar("T")
HEARTBEAT_REPLIES = 4  # ZADD, ZREMRANGEBYSCORE, ZCARD, PEXPIRE
TIME_SCRIPT = "return redis.call('TIME')"


def client_defaults() -> dict[str, Any]:
    """Connection options used unless the URL overrides them: fail fast, never retry."""
    return {
        "socket_timeout": 0.25,
        "socket_connect_timeout": 0.25,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_error": [],
    }


class RedisStorage:
    """A `Storage` over a redis-py asyncio client (`Redis` or `RedisCluster`)."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        description: str,
        prefix: str = DEFAULT_PREFIX,
        node_id: str = "",
        node_ttl_ms: int = DEFAULT_NODE_TTL_MS,
        on_close: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.client = client
        self.keys = KeySchema(prefix)
        self.node_id = node_id
        self.node_ttl_ms = node_ttl_ms
        self.round_trips = 0  # pipelines sent; on Cluster each fans out to the nodes in parallel
        self._description = description
        self._on_close = tuple(on_close)

    @property
    def description(self) -> str:
        return self._description

    async def sync(self, batch: SyncBatch) -> SyncResult:
        # Packing and parsing a large batch is pure string work: done in a worker thread, so
        # the event loop keeps answering requests meanwhile (the GIL switches every 5 ms).
        big = len(batch.pushes) > THREAD_ABOVE
        chunks, calls = await _maybe_thread(big, self._prepare, batch.pushes)
        try:
            scripts = [("EVALSHA", SYNC_SHA, *args) for args in calls]
            replies = await self._run(scripts + self._commands(batch))
            await self._reload_script(calls, replies)
        except Exception:
            await self._forget_topology()
            raise
        return await _maybe_thread(big, self._parse, batch, chunks, replies)

    def _prepare(self, pushes: Sequence[Push]) -> tuple[list[list[int]], list[tuple[Any, ...]]]:
        chunks = self._chunks(pushes)
        return chunks, [self._script_args(pushes, chunk) for chunk in chunks]

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()
        for closer in self._on_close:
            await closer()

    def _commands(self, batch: SyncBatch) -> list[tuple[Any, ...]]:
        """The reads and the heartbeat, in the order `_parse` reads their replies back."""
        keys = self.keys
        commands: list[tuple[Any, ...]] = [
            ("GET", keys.counter(r.key, r.window)) for r in batch.total_reads
        ]
        commands.append(self._time_command())
        if self._heartbeat_on:
            # Scores are the node's own clock (batch.now_ms), not Redis TIME: that would cost a
            # round trip, and NTP-level skew (ms) is noise against a TTL of tens of seconds.
            # Only a clock off by more than the TTL miscounts, and only this fallback estimate.
            nodes, now = keys.nodes(), batch.now_ms
            commands += [
                ("ZADD", nodes, now, self.node_id),
                ("ZREMRANGEBYSCORE", nodes, "-inf", now - self.node_ttl_ms),
                ("ZCARD", nodes),
                ("PEXPIRE", nodes, self.node_ttl_ms),
            ]
        return commands

    def _time_command(self) -> tuple[Any, ...]:
        """The store's clock, read after the pushes (the span clock, see server/storeclock.py).

        A Cluster pipeline refuses keyless TIME, so there it runs in a one-line script routed
        by the heartbeat key's slot; any primary's clock will do."""
        if isinstance(self.client, RedisCluster):
            return ("EVAL", TIME_SCRIPT, 1, self.keys.nodes())
        return ("TIME",)

    def _chunks(self, pushes: Sequence[Push]) -> list[list[int]]:
        """Push indexes grouped into script calls; on Cluster a call may only touch one slot."""
        if not isinstance(self.client, RedisCluster):
            indexes = list(range(len(pushes)))
            return [indexes[i : i + CHUNK_KEYS] for i in range(0, len(indexes), CHUNK_KEYS)]
        by_slot: dict[int, list[int]] = {}
        for index, push in enumerate(pushes):
            by_slot.setdefault(key_slot(self.keys.tag(push.key).encode()), []).append(index)
        return [
            group[i : i + CHUNK_KEYS]
            for group in by_slot.values()
            for i in range(0, len(group), CHUNK_KEYS)
        ]

    def _script_args(self, pushes: Sequence[Push], chunk: list[int]) -> tuple[Any, ...]:
        """numkeys, KEYS and ARGV of sync.lua for the pushes at `chunk`."""
        entries = []
        for index in chunk:
            push, limit = pushes[index], pushes[index].limit
            entries.append(
                f"{digest(push.key)}|{counter_suffix(push.key, push.window)}|{push.count}|"
                f"{2 * limit.window_ms}|{limit.requests_per_unit}|{limit.cooldown}"
            )
        first = pushes[chunk[0]]
        route = self.keys.counter(first.key, first.window)
        return (1, route, self.keys.prefix, ";".join(entries))

    @property
    def _heartbeat_on(self) -> bool:
        return bool(self.node_id and self.node_ttl_ms)

    async def _run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """One pipeline; error replies come back in place so NOSCRIPT can be repaired."""
        if not commands:
            return []
        self.round_trips += 1
        async with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    async def _reload_script(self, calls: list[tuple[Any, ...]], replies: list[Any]) -> None:
        """Re-run with EVAL the script calls a server rejected for not knowing the script.

        That happens once after a server restart or SCRIPT FLUSH. A NOSCRIPT reply means the
        script did not run, so re-sending it cannot count twice. EVAL also caches the script,
        so the following syncs are single round trips again (a server that evicts old EVAL
        scripts just makes this happen again). redis-py's own `Script` objects would instead
        send SCRIPT EXISTS before every pipeline: two round trips per sync.
        """
        missing = [i for i in range(len(calls)) if _noscript(replies[i])]
        if not missing:
            return
        retry = [("EVAL", SYNC_SCRIPT, *calls[i]) for i in missing]
        for i, reply in zip(missing, await self._run(retry), strict=True):
            replies[i] = reply

    async def _forget_topology(self) -> None:
        """After a failure on Cluster, rediscover the slot map on the next sync (failover)."""
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()

    def _parse(self, batch: SyncBatch, chunks: list[list[int]], replies: list[Any]) -> SyncResult:
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        n_calls, n_flag = len(chunks), 0
        n_total = len(batch.total_reads)
        expected = n_calls + n_flag + n_total + 1 + (HEARTBEAT_REPLIES if self._heartbeat_on else 0)
        if len(replies) != expected:
            raise RuntimeError(f"redis answered {len(replies)} replies for {expected} commands")
        pushes = _push_results(len(batch.pushes), chunks, replies[:n_calls])
        end = n_calls + n_flag + n_total
        totals = tuple(0 if r is None else int(r) for r in replies[n_calls + n_flag : end])
        seconds, micros = replies[end]
        live = int(replies[end + 3]) if self._heartbeat_on else 0
        return SyncResult(pushes, totals, live, int(seconds) * 1000 + int(micros) // 1000)


def _push_results(
    count: int, chunks: list[list[int]], replies: list[Any]
) -> tuple[PushResult, ...]:
    """Unpack each call's "total,left;..." answer back into batch order."""
    results: list[PushResult | None] = [None] * count
    for chunk, reply in zip(chunks, replies, strict=True):
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        answers = text.split(";") if text else []
        if len(answers) != len(chunk):
            raise RuntimeError(f"sync script answered {len(answers)} of {len(chunk)} keys")
        for index, answer in zip(chunk, answers, strict=True):
            total, left = answer.split(",")
            results[index] = PushResult(int(total), max(0, int(left)))
    return tuple(r for r in results if r is not None)


async def _maybe_thread(big: bool, func: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(func, *args) if big else func(*args)


def _noscript(reply: Any) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
    )


# --- URLs -------------------------------------------------------------------------------------

_SCHEMES = "redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// (rediss+... for TLS)"


def open_redis(
    url: str,
    prefix: str = DEFAULT_PREFIX,
    node_id: str = "",
    *,
    node_ttl_ms: int = DEFAULT_NODE_TTL_MS,
) -> RedisStorage:
    """A `RedisStorage` for `url` (forms in the module docstring). Connects lazily.

    Raises ValueError, without the password, for a URL it cannot use.
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    opener = _OPENERS.get(scheme)
    if opener is None:
        raise ValueError(f"unsupported redis URL {redact(url)!r}: use {_SCHEMES}")
    try:
        client, description, closers = opener(url, node_id)
        if isinstance(client, Redis):
            # Connections are made lazily; building one now (no I/O) rejects unknown or
            # ill-typed query options here instead of at the first sync.
            client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, RedisError, RedisClusterException) as exc:
        message = _scrub(str(exc), url)
        raise ValueError(f"invalid redis URL {redact(url)!r}: {message}") from None
    return RedisStorage(
        client,
        description=description,
        prefix=prefix,
        node_id=node_id,
        node_ttl_ms=node_ttl_ms,
        on_close=closers,
    )


Opened = tuple[Redis | RedisCluster, str, list[Callable[[], Awaitable[None]]]]


def _standalone(url: str, node_id: str) -> Opened:
    options = {**client_defaults(), **_client_name(node_id)}
    client = Redis.from_url(url, **options)  # query parameters win over these defaults
    kw = client.connection_pool.connection_kwargs
    db = kw.get("db", 0)
    if client.connection_pool.connection_class is UnixDomainSocketConnection:
        return client, f"unix://{kw['path']}?db={db}", []
    tls = client.connection_pool.connection_class is SSLConnection
    return client, f"{'rediss' if tls else 'redis'}://{_hostport(kw['host'], kw['port'])}/{db}", []


def _cluster(url: str, node_id: str) -> Opened:
    hosts, path, options = _multi_host(url)
    if path.strip("/") not in ("", "0") or options.pop("db", 0):
        raise ValueError("Redis Cluster has only database 0")
    nodes = [ClusterNode(host, port) for host, port in hosts]
    client = RedisCluster(startup_nodes=nodes, **{**_client_name(node_id), **options})
    scheme = "rediss-cluster" if options.get("ssl") else "redis-cluster"
    return client, f"{scheme}://{','.join(_hostport(h, p) for h, p in hosts)}", []


def _sentinel(url: str, node_id: str) -> Opened:
    hosts, path, options = _multi_host(url)
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError("the path must be /service_name or /service_name/db")
    service, db = parts[0], int(parts[1]) if len(parts) == 2 else options.pop("db", 0)
    on_sentinels = {k: v for k, v in options.items() if k.startswith(("socket_", "ssl", "retry"))}
    for key in ("username", "password"):
        if (value := options.pop(f"sentinel_{key}", None)) is not None:
            on_sentinels[key] = value
    sentinel = Sentinel(hosts, sentinel_kwargs=on_sentinels, **options)  # type: ignore[no-untyped-call]
    master_options: dict[str, Any] = {"db": db, **_client_name(node_id)}
    client: Redis = sentinel.master_for(service, **master_options)
    scheme = "rediss-sentinel" if options.get("ssl") else "redis-sentinel"
    where = ",".join(_hostport(h, p) for h, p in hosts)
    closers = [_closer(s) for s in sentinel.sentinels]
    return client, f"{scheme}://{where}/{service}/{db}", closers


def _closer(client: Redis) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        await client.aclose()

    return close


def _multi_host(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """Split `scheme://[auth@]h1:p1,h2:p2/path?query`; options are parsed by redis-py."""
    scheme, _, rest = url.partition("://")
    head, _, query = rest.partition("#")[0].partition("?")
    netloc, slash, path = head.partition("/")
    auth, at, hostlist = netloc.rpartition("@")
    hosts = [_parse_hostport(h) for h in hostlist.split(",") if h]
    if not hosts:
        raise ValueError("no host:port given")
    base = "rediss" if scheme.lower().startswith("rediss") else "redis"
    first = _hostport(*hosts[0])
    options = dict(parse_url(f"{base}://{auth}{at}{first}/{'?' + query if query else ''}"))
    for key in ("host", "port", "path"):
        options.pop(key, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return hosts, slash + path, {**client_defaults(), **options}


def _parse_hostport(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if match is None:
        raise ValueError(f"expected host:port, got {text!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {text!r}")
    return unquote(host), port


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _client_name(node_id: str) -> dict[str, str]:
    """CLIENT SETNAME on connect, so operators can tell sidecars apart in CLIENT LIST."""
    return {"client_name": f"rls-{readable(node_id, 64)}"} if node_id else {}


def redact(url: str) -> str:
    """`url` without credentials: the user-info part and any `*password=` query value."""
    scheme, sep, rest = url.partition("://")
    head, q, query = rest.partition("?")
    if "@" in head:
        head = "***@" + head.rpartition("@")[2]
    query = re.sub(r"((?:^|&)[^=&]*password=)[^&]*", r"\1***", query, flags=re.IGNORECASE)
    return scheme + sep + head + q + query


def _scrub(message: str, url: str) -> str:
    """Remove from an error message anything that could be a secret from `url`."""
    head = url.partition("://")[2].partition("?")[0]
    auth = head.rpartition("@")[0] if "@" in head else ""
    secrets = [auth.partition(":")[2], *re.findall(r"password=([^&]*)", url, re.IGNORECASE)]
    for secret in filter(None, secrets):
        message = message.replace(secret, "***").replace(unquote(secret), "***")
    return message


_OPENERS: dict[str, Callable[[str, str], Opened]] = {
    "redis": _standalone,
    "rediss": _standalone,
    "unix": _standalone,
    "redis+cluster": _cluster,
    "rediss+cluster": _cluster,
    "redis+sentinel": _sentinel,
    "rediss+sentinel": _sentinel,
}
