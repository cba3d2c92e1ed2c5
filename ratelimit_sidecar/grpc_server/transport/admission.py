"""Which connections the gRPC port keeps: a cap on all of them and one per peer address.

A process has a fixed number of file descriptors; a peer that opens connections and sends
nothing would otherwise take them all, and then every new connection (Envoy's own) is refused
by the kernel. Below the cap nothing happens. At a cap, the connection that has been quiet the
longest and has no open call is closed (GOAWAY NO_ERROR: its client may reconnect at once) to
make room, so a new connection is always served while any connection is idle; only when every
connection has calls open is the new one refused.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from typing import Protocol

FDS_KEPT = 128  # descriptors left for everything else: Redis, the HTTP side, files, the loop


class Admitted(Protocol):
    """What the caps need of a connection (connection.py)."""

    peer: str
    last_active: float

    def idle(self) -> bool: ...

    def goaway(self) -> None: ...

    def fail(self, code: int, reason: str) -> None: ...


def default_max_connections() -> int:
    """Below the process's descriptor limit, with room for its other descriptors."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(16, soft - FDS_KEPT)


class Admission:
    """The open connections by peer host, and how often each cap made room or refused."""

    def __init__(self, max_connections: int, max_per_peer: int) -> None:
        self.max_connections, self.max_per_peer = max_connections, max_per_peer
        self.by_peer: dict[str, dict[Admitted, None]] = {}
        self.count = 0
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # new connections refused: every other one had calls open
        self.tls_timeouts = 0  # TLS handshakes not done within the timeout
        self.tls_failures = 0  # other failed handshakes

    def admit(self, conn: Admitted) -> bool:
        """Take `conn`, closing an idle connection if a cap is reached; False: refuse it."""
        host = _host(conn.peer)
        same_peer = self.by_peer.setdefault(host, {})
        if len(same_peer) >= self.max_per_peer and not self._evict(same_peer):
            self.refused += 1
            return False
        if self.count >= self.max_connections and not self._evict_any():
            self.refused += 1
            return False
        same_peer[conn] = None
        self.count += 1
        return True

    def left(self, conn: Admitted) -> None:
        """`conn` closed (or is closing: an evicted one is counted out at once)."""
        host = _host(conn.peer)
        same_peer = self.by_peer.get(host)
        if same_peer is None or conn not in same_peer:
            return
        del same_peer[conn]
        self.count -= 1
        if not same_peer:
            del self.by_peer[host]

    def connections(self) -> list[Admitted]:
        return [conn for peers in self.by_peer.values() for conn in peers]

    def tls_failed(self, timed_out: bool) -> None:
        if timed_out:
            self.tls_timeouts += 1
        else:
            self.tls_failures += 1

    def _evict_any(self) -> bool:
        everyone = (conn for peers in self.by_peer.values() for conn in peers)
        return self._close_quietest(everyone)

    def _evict(self, peers: dict[Admitted, None]) -> bool:
        return self._close_quietest(iter(peers))

    def _close_quietest(self, candidates: Iterator[Admitted]) -> bool:
        idle = [conn for conn in candidates if conn.idle()]
        if not idle:
            return False
        quietest = min(idle, key=lambda conn: conn.last_active)
        self.left(quietest)  # counted out now: its transport closes a little later
        quietest.fail(0, "too many connections")
        self.evicted += 1
        return True


def _host(peer: str) -> str:
    return peer.rpartition(":")[0] or peer
