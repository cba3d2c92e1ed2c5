"""Sidecar processes sharing overrides through one Redis: the admin API, what each node applies.

Used by tests/integration/test_overrides_fleet.py and bench/overrides.py. Every node opens its
admin API on a free loopback port with the token `TOKEN`; `/debug/rules` tells which override
version a node has applied, a check-only ShouldRateLimit (hits 0) which limit it enforces.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from harness.grpc_client import request, rls_stub
from harness.net import free_port, free_ports
from harness.sidecar import SidecarProcess

TOKEN = "test-admin-token-4b1d"
DOMAIN = "gateway"


class OverrideNode:
    """One sidecar with its admin API; `start()` again after `stop()` restarts it alike."""

    def __init__(self, rules: Path, redis_url: str, node_id: str, *extra: str) -> None:
        self.admin_port = free_port()
        self._args = (
            *("--redis-url", redis_url, "--node-id", node_id),
            *("--admin-address", f"127.0.0.1:{self.admin_port}", *extra),
        )
        self._rules = rules
        self.process: SidecarProcess | None = None
        self._channel: grpc.Channel | None = None
        self._stub: object = None

    def start(self) -> OverrideNode:
        """Start and wait until it serves gRPC (the override set is read before that)."""
        ports = free_ports(2, avoid=(self.admin_port,))  # fresh ones at each start
        env = {"RLS_ADMIN_TOKEN": TOKEN}
        self.process = SidecarProcess(self._rules, *self._args, env=env, ports=(ports[0], ports[1]))
        self.process.wait_ready()
        self._channel = grpc.insecure_channel(self.process.address)
        self._stub = rls_stub(self._channel)
        return self

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.process is not None:
            self.process.stop()

    def admin(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
        """One admin call: the status code and the JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(call, timeout=5) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def put(self, value: str, per_minute: int, **extra: object) -> tuple[int, dict[str, object]]:
        return self.admin("PUT", "/v1/overrides", override_body(value, per_minute, **extra))

    def applied(self) -> dict[str, object]:
        """The `overrides` part of /debug/rules: version, in_force, store_up."""
        assert self.process is not None
        url = f"http://127.0.0.1:{self.process.metrics_port}/debug/rules"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return dict(json.loads(reply.read())["overrides"])

    def version(self) -> int:
        version = self.applied()["version"]
        assert isinstance(version, int)
        return version

    def metrics(self) -> str:
        assert self.process is not None
        url = f"http://127.0.0.1:{self.process.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    def enforces(self, value: str, limit: int) -> Callable[[], bool]:
        return lambda: self.limit(value) == limit

    def limit(self, value: str) -> int:
        """The requests per unit this node enforces for api_key=`value` (checked, not counted);
        0 when no limit applies."""
        message = request(DOMAIN, [("api_key", value)], descriptor_hits=[0])
        answer = self._stub.ShouldRateLimit(message, timeout=5)  # type: ignore[attr-defined]
        status = answer.statuses[0]
        return (
            int(status.current_limit.requests_per_unit) if status.HasField("current_limit") else 0
        )


def override_body(value: str, per_minute: int, **extra: object) -> dict[str, object]:
    return {
        "domain": DOMAIN,
        "descriptor": [{"key": "api_key", "value": value}],
        "rate_limit": {"unit": "minute", "requests_per_unit": per_minute},
        **extra,
    }


RULES = f"""\
domain: {DOMAIN}
descriptors:
  - key: api_key
    rate_limit: {{unit: minute, requests_per_unit: 1000}}
"""
FILE_LIMIT = 1000


def wait_until(
    check: Callable[[], bool], timeout_s: float, interval_s: float = 0.005
) -> float | None:
    """Seconds until `check()` held (polled), or None if it never did within `timeout_s`."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(interval_s)


def all_at(nodes: Sequence[OverrideNode], version: int) -> Callable[[], bool]:
    return lambda: all(node.version() >= version for node in nodes)
