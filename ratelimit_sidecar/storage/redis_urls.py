"""Opening a `RedisStorage` from a URL: standalone, Cluster or Sentinel, with or without TLS.

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

import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from ratelimit_sidecar.logs import redact
from ratelimit_sidecar.storage.keys import DEFAULT_PREFIX, readable
from ratelimit_sidecar.storage.redis_store import DEFAULT_NODE_TTL_MS, RedisStorage

_SCHEMES = "redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// (rediss+... for TLS)"
Opened = tuple[Redis | RedisCluster, str, list[Callable[[], Awaitable[None]]]]


def client_defaults() -> dict[str, Any]:
    """Fail fast, never retry (the URL may override)."""
    return {
        "socket_timeout": 0.25,
        "socket_connect_timeout": 0.25,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_error": [],
    }


def open_redis(
    url: str,
    prefix: str = DEFAULT_PREFIX,
    node_id: str = "",
    *,
    node_ttl_ms: int = DEFAULT_NODE_TTL_MS,
) -> RedisStorage:
    """Connects lazily; ValueError, without the password, for a URL it cannot use."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    opener = _OPENERS.get(scheme.replace("rediss", "redis"))  # the same, with TLS
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


def _standalone(url: str, node_id: str) -> Opened:
    options = {**client_defaults(), **_client_name(node_id)}
    client = Redis.from_url(url, **options)  # query parameters win over these defaults
    kw = client.connection_pool.connection_kwargs
    db = kw.get("db", 0)
    if client.connection_pool.connection_class is UnixDomainSocketConnection:
        return client, f"unix://{kw['path']}?db={db}", []
    tls = client.connection_pool.connection_class is SSLConnection
    return client, f"{'rediss' if tls else 'redis'}://{hostport(kw['host'], kw['port'])}/{db}", []


def _cluster(url: str, node_id: str) -> Opened:
    hosts, path, options = _multi_host(url)
    if path.strip("/") not in ("", "0") or options.pop("db", 0):
        raise ValueError("Redis Cluster has only database 0")
    nodes = [ClusterNode(host, port) for host, port in hosts]
    client = RedisCluster(startup_nodes=nodes, **{**_client_name(node_id), **options})
    scheme = "rediss-cluster" if options.get("ssl") else "redis-cluster"
    return client, f"{scheme}://{','.join(hostport(h, p) for h, p in hosts)}", []


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
    sentinel = Sentinel(hosts, sentinel_kwargs=on_sentinels, **options)  # type: ignore[no-untyped-call,unused-ignore]
    master_options: dict[str, Any] = {"db": db, **_client_name(node_id)}
    client: Redis = sentinel.master_for(service, **master_options)
    scheme = "rediss-sentinel" if options.get("ssl") else "redis-sentinel"
    where = ",".join(hostport(h, p) for h, p in hosts)
    closers: list[Callable[[], Awaitable[None]]] = [s.aclose for s in sentinel.sentinels]
    return client, f"{scheme}://{where}/{service}/{db}", closers


def _multi_host(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """`scheme://[auth@]h1:p1,h2:p2/path?query`; options parsed by redis-py."""
    scheme, _, rest = url.partition("://")
    head, _, query = rest.partition("#")[0].partition("?")
    netloc, slash, path = head.partition("/")
    auth, at, hostlist = netloc.rpartition("@")
    hosts = [parse_hostport(h) for h in hostlist.split(",") if h]
    if not hosts:
        raise ValueError("no host:port given")
    base = "rediss" if scheme.lower().startswith("rediss") else "redis"
    first = hostport(*hosts[0])
    options = dict(parse_url(f"{base}://{auth}{at}{first}/{'?' + query if query else ''}"))
    for key in ("host", "port", "path"):
        options.pop(key, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return hosts, slash + path, {**client_defaults(), **options}


def parse_hostport(text: str) -> tuple[str, int]:
    """`host:port` or `[ipv6]:port`."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if match is None:
        raise ValueError(f"expected host:port, got {text!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {text!r}")
    return unquote(host), port


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _client_name(node_id: str) -> dict[str, str]:
    """So operators can tell sidecars apart in CLIENT LIST."""
    return {"client_name": f"rls-{readable(node_id, 64)}"} if node_id else {}


def _scrub(message: str, url: str) -> str:
    """redis-py quotes option values and URL parts not always URL-shaped, so `redact` alone
    cannot find the secrets."""
    head = url.partition("://")[2].partition("?")[0]
    auth = head.rpartition("@")[0] if "@" in head else ""
    secrets = [auth.partition(":")[2], *re.findall(r"password=([^&]*)", url, re.IGNORECASE)]
    for secret in filter(None, secrets):
        message = message.replace(secret, "***").replace(unquote(secret), "***")
    return message


_OPENERS: dict[str, Callable[[str, str], Opened]] = {
    "redis": _standalone,
    "unix": _standalone,
    "redis+cluster": _cluster,
    "redis+sentinel": _sentinel,
}
