"""The shared store on Redis (standalone, Sentinel or Cluster), one pipeline per span end.

`RedisStorage.sync` turns a `SyncBatch` into one non-transactional pipeline: the push script
(`push.lua`) per Push, `PTTL` per FlagRead, `GET` per TotalRead, then the node heartbeat. On
Cluster, redis-py splits that pipeline by node and sends the parts concurrently: one round trip
per Redis node. Semantics are those of `MemoryStorage`; the key names are in `keys.py`.

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

import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any
from urllib.parse import unquote

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ratelimit_sidecar.core.types import Push, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.storage.keys import DEFAULT_PREFIX, KeySchema, readable

PUSH_SCRIPT = resources.files(__package__).joinpath("push.lua").read_text(encoding="utf-8")
PUSH_SHA = hashlib.sha1(PUSH_SCRIPT.encode("utf-8")).hexdigest()
DEFAULT_NODE_TTL_MS = 30_000
HEARTBEAT_REPLIES = 4  # ZADD, ZREMRANGEBYSCORE, ZCARD, PEXPIRE


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
        try:
            replies = await self._run(self._commands(batch))
            await self._reload_script(batch, replies)
        except Exception:
            await self._forget_topology()
            raise
        return self._parse(batch, replies)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()
        for closer in self._on_close:
            await closer()

    def _commands(self, batch: SyncBatch) -> list[tuple[Any, ...]]:
        """The pipeline for `batch`, in the order `_parse` reads the replies back."""
        keys = self.keys
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", PUSH_SHA, 2, *self._push_args(p)) for p in batch.pushes
        ]
        commands += [("PTTL", keys.flag(r.key)) for r in batch.flag_reads]
        commands += [("GET", keys.counter(r.key, r.window)) for r in batch.total_reads]
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

    def _push_args(self, push: Push) -> tuple[Any, ...]:
        """KEYS and ARGV of push.lua."""
        limit = push.limit
        counter, flag = self.keys.counter(push.key, push.window), self.keys.flag(push.key)
        return (
            counter,
            flag,
            push.count,
            2 * limit.window_ms,
            limit.requests_per_unit,
            limit.cooldown,
        )

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

    async def _reload_script(self, batch: SyncBatch, replies: list[Any]) -> None:
        """Re-run with EVAL the pushes a server rejected for not knowing the script.

        That happens once after a server restart or SCRIPT FLUSH. A NOSCRIPT reply means the
        script did not run, so re-sending it cannot count twice. EVAL also caches the script,
        so the following syncs are single round trips again (a server that evicts old EVAL
        scripts just makes this happen again). redis-py's own `Script` objects would instead
        send SCRIPT EXISTS before every pipeline: two round trips per sync.
        """
        missing = [i for i, r in enumerate(replies[: len(batch.pushes)]) if _noscript(r)]
        if not missing:
            return
        retry = [("EVAL", PUSH_SCRIPT, 2, *self._push_args(batch.pushes[i])) for i in missing]
        for i, reply in zip(missing, await self._run(retry), strict=True):
            replies[i] = reply

    async def _forget_topology(self) -> None:
        """After a failure on Cluster, rediscover the slot map on the next sync (failover)."""
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()

    def _parse(self, batch: SyncBatch, replies: list[Any]) -> SyncResult:
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        n_push, n_flag = len(batch.pushes), len(batch.flag_reads)
        n_total = len(batch.total_reads)
        expected = n_push + n_flag + n_total + (HEARTBEAT_REPLIES if self._heartbeat_on else 0)
        if len(replies) != expected:
            raise RuntimeError(f"redis answered {len(replies)} replies for {expected} commands")
        pushes = tuple(PushResult(int(r[0]), max(0, int(r[1]))) for r in replies[:n_push])
        # PTTL -2 (no flag) and -1 (a flag without TTL, never written by us) both mean "not
        # blocked": a stray key must not block a descriptor forever.
        flags = tuple(max(0, int(r)) for r in replies[n_push : n_push + n_flag])
        end = n_push + n_flag + n_total
        totals = tuple(0 if r is None else int(r) for r in replies[n_push + n_flag : end])
        live = int(replies[end + 2]) if self._heartbeat_on else 0
        return SyncResult(pushes, flags, totals, live)


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
