"""Loopback ports and probes that tell whether a server answers."""

from __future__ import annotations

import contextlib
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Collection

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    """A port the kernel reports free on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """Ports free on 127.0.0.1, all distinct (sockets held until all picked) and none in
    `avoid` (ports picked before that nothing holds yet), below the kernel's ephemeral range: a
    port from that range (what binding port 0 gives) may become an outgoing connection's source
    port before the server binds it ("Address already in use"). One call for the ports of one
    process: two calls may pick the same port."""
    low = _ephemeral_low()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(100 * count):  # bounded: another process may hold a port tried
            if len(ports) == count:
                break
            port = random.randrange(max(1024, low - 20_000), low)
            if port in avoid:
                continue
            with contextlib.suppress(OSError):
                stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
                ports.append(port)
        if len(ports) < count:
            raise RuntimeError(f"no {count} free ports below {low}")
        return ports


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return max(int(ranges.read().split()[0]), 2048)
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def consecutive_free_ports(count: int, avoid: tuple[int, ...] = ()) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 (none in `avoid`): a
    `--workers` node takes its metrics port + worker index."""
    for _ in range(100):
        base = free_port()
        ports = range(base, base + count)
        if base + count > 65535 or any(port in avoid for port in ports):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in ports:
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True if a GET of `url` answers with a status below 400."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except OSError:  # refused, timed out, or an HTTPError status
        return False


def http_call(port: int, path: str, body: bytes | None = None) -> tuple[int, str]:
    """GET (or POST `body`) http://127.0.0.1:`port``path`: the status and the body's text."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_grpc_serving(address: str, timeout_s: float = 15.0) -> None:
    """Block until the gRPC health check at `address` answers SERVING."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} answered but not SERVING after {timeout_s:g} s")
            time.sleep(0.05)
