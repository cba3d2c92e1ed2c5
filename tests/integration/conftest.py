"""Real Redis/Valkey servers for the integration tests (process code: harness/redis_servers.py).

Servers start on first use, on free loopback ports, and are all stopped at session end, even
when tests fail (the session fixture's finally, plus an atexit hook in harness.redis_servers).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.redis_servers import Cluster, Sentinel, ServerGroup, ServerProcess
from harness.tls_proxy import TlsProxy, make_cert

ACL_USER, ACL_PASSWORD = "rls-test", "s3cret:p@ss/word"


@dataclass(frozen=True)
class TlsEndpoint:
    """A TLS port in front of `server`; `ca` is the certificate clients must trust."""

    port: int
    ca: Path
    server: ServerProcess

    def url(self, query: str = "") -> str:
        return f"rediss://127.0.0.1:{self.port}/0{'?' + query if query else ''}"


@pytest.fixture(scope="session")
def server_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = ServerGroup(tmp_path_factory.mktemp("redis"))
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture(scope="session")
def redis_server(server_group: ServerGroup) -> ServerProcess:
    """The shared standalone server (also on a unix socket, and with an ACL user).

    Tests must not depend on other tests' keys: each uses its own key prefix.
    """
    server = server_group.standalone()
    with server.client() as admin:
        admin.acl_setuser(
            ACL_USER, enabled=True, passwords=[f"+{ACL_PASSWORD}"], keys="*", commands=["+@all"]
        )
    return server


@pytest.fixture
def own_redis_server(server_group: ServerGroup) -> Iterator[ServerProcess]:
    """A standalone server for one test only: for killing, pausing and restarting."""
    server = server_group.standalone()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def module_redis_server(server_group: ServerGroup) -> Iterator[ServerProcess]:
    """A standalone server for one module's tests: a fleet of sidecar processes shares it, and
    its tests may kill and restart it."""
    server = server_group.standalone()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(server_group: ServerGroup) -> Cluster:
    return server_group.cluster(masters=3)


@pytest.fixture(scope="session")
def redis_sentinel(server_group: ServerGroup) -> Sentinel:
    return server_group.sentinel()


@pytest.fixture(scope="session")
def redis_tls(
    redis_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsEndpoint]:
    cert, key = make_cert(tmp_path_factory.mktemp("tls"))
    proxy = TlsProxy(redis_server.port, cert, key)
    proxy.start()
    try:
        yield TlsEndpoint(proxy.port, cert, redis_server)
    finally:
        proxy.stop()
