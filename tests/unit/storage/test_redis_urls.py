"""Opening URLs without a server: host:port parsing and errors that never show a password."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from ratelimit_sidecar.storage.redis_urls import hostport, open_redis, parse_hostport


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("localhost:1", ("localhost", 1)),
        ("[::1]:7000", ("::1", 7000)),
        ("my%2Dhost:65535", ("my-host", 65535)),
    ],
)
def test_host_port_forms(text: str, parsed: tuple[str, int]) -> None:
    assert parse_hostport(text) == parsed
    assert parse_hostport(hostport(*parsed)) == parsed


@pytest.mark.parametrize("text", ["127.0.0.1", "h:0", "h:65536", "::1:7000", "h:port", ":1"])
def test_bad_host_ports_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(text)


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:pw-secret@127.0.0.1:6379/0?socket_timeout=soon",
        "redis://127.0.0.1:6379/0?password=pw-secret&socket_timeout=soon",
        "redis+sentinel://127.0.0.1:26379/m?sentinel_password=pw-secret&socket_timeout=soon",
        "ftp://u:pw-secret@h:1/?password=pw-secret",
    ],
)
def test_errors_quote_the_url_without_its_passwords(url: str) -> None:
    with pytest.raises(ValueError, match="redis URL") as failure:
        open_redis(url, "t:", "n")
    message = str(failure.value)
    assert "pw-secret" not in message
    assert "127.0.0.1" in message or "ftp://u:***@h:1" in message


def test_a_good_url_opens_lazily_and_describes_itself() -> None:
    store = open_redis("redis://u:pw-secret@127.0.0.1:1/3?socket_timeout=2", "t:", "n")
    assert store.description == "redis://127.0.0.1:1/3"
    assert isinstance(store.client, Redis)
    assert store.client.connection_pool.connection_kwargs["socket_timeout"] == 2.0
