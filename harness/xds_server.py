"""A state-of-the-world ADS control plane on loopback, serving `RateLimitConfig` like Envoy
Gateway does, for tests and benchmarks.

`push` sets the snapshot (the whole set, one version); every open stream that has subscribed is
sent it with a fresh nonce. Every request received is kept (`requests`), so tests can check
ACKs (version and nonce) and NACKs (`error_detail`). `stop` kills the server and its streams at
once; `start` again listens on the same port. With `tls`, clients must present a certificate
signed by the CA (mTLS), and `peers` records each stream's client certificate name.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.any_pb2 import Any as AnyMessage

from ratelimit_sidecar._proto.envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls
from ratelimit_sidecar.config.xds_rules import RESOURCE_TYPE

GATEWAY_DOMAIN = "default/eg/http"  # Envoy Gateway: the listener; its resource is named so
# What Envoy sends for the first rule of `gateway_config`, before the client address.
GATEWAY_PREFIX = (("rule-0-match-0", "rule-0-match-0"), ("masked_remote_address", "0.0.0.0/0"))
Request = discovery_pb2.DiscoveryRequest
Response = discovery_pb2.DiscoveryResponse


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate and key, and the CA its clients' certificates must chain to."""

    cert: Path
    key: Path
    client_ca: Path

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes(),
            require_client_auth=True,
        )


@dataclass
class _Snapshot:
    version: str
    resources: list[AnyMessage]


def gateway_config(
    limit: int = 10, unit: rls.RateLimitUnit = rls.MINUTE, domain: str = GATEWAY_DOMAIN
) -> rls.RateLimitConfig:
    """As Envoy Gateway shapes one route's rules: `rule-<i>-match-<j>` levels, the client
    CIDR as `masked_remote_address` with a per-address leaf, and a shadow rule."""
    per_ip = rls.RateLimitDescriptor(
        key="remote_address", rate_limit=rls.RateLimitPolicy(unit=unit, requests_per_unit=limit)
    )
    cidr = rls.RateLimitDescriptor(
        key="masked_remote_address", value="0.0.0.0/0", descriptors=[per_ip]
    )
    header = rls.RateLimitDescriptor(
        key="rule-0-match-0", value="rule-0-match-0", descriptors=[cidr]
    )
    shadow = rls.RateLimitDescriptor(
        key="rule-1-match--1",
        value="rule-1-match--1",
        shadow_mode=True,
        rate_limit=rls.RateLimitPolicy(unit=rls.WEEK, requests_per_unit=1),
    )
    return rls.RateLimitConfig(name=domain, domain=domain, descriptors=[header, shadow])


class AdsServer:
    """The control plane; `start` before use, `stop` at the end (idempotent)."""

    def __init__(self, tls: ServerTls | None = None) -> None:
        self.tls = tls
        self.port = 0
        self.requests: list[Request] = []
        self.peers: list[str] = []  # one per stream: the client certificate's common name
        self.streams = 0
        self._snapshot: _Snapshot | None = None
        self._nonces = itertools.count(1)
        self._sent: dict[str, set[str]] = {}  # the nonces sent, by version
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None
        self._stopping = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> AdsServer:
        server = grpc.server(ThreadPoolExecutor(max_workers=32))
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        target = f"127.0.0.1:{self.port}"
        if self.tls is None:
            self.port = server.add_insecure_port(target)
        else:
            self.port = server.add_secure_port(target, self.tls.credentials())
        with self._changed:
            self._stopping = False
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._server is not None:
            self._server.stop(grace=None).wait(10)
            self._server = None

    def push(self, configs: Sequence[rls.RateLimitConfig | AnyMessage], version: str) -> None:
        """Serve `configs` as the whole set, at `version`, to every subscribed stream."""
        resources = []
        for config in configs:
            if isinstance(config, AnyMessage):
                resources.append(config)
            else:
                resource = AnyMessage()
                resource.Pack(config, type_url_prefix="type.googleapis.com/")
                resources.append(resource)
        with self._changed:
            self._snapshot = _Snapshot(version, resources)
            self._changed.notify_all()

    def answers_to(self, version: str) -> list[Request]:
        """The requests that answer the responses sent for `version` (ACKs or NACKs)."""
        nonces = self._sent.get(version, set())
        return [r for r in list(self.requests) if r.response_nonce in nonces]

    def wait_for(self, check: Callable[[], bool], timeout_s: float = 5.0) -> float:
        """Seconds until `check()` held; AssertionError after `timeout_s`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if check():
                return time.monotonic() - started
            time.sleep(0.02)
        raise AssertionError(f"not within {timeout_s} s; requests: {self.requests}")

    def _stream(
        self, requests: Iterator[Request], context: grpc.ServicerContext
    ) -> Iterator[Response]:
        self.streams += 1
        self.peers.append(_common_name(context))
        subscribed = threading.Event()
        threading.Thread(target=self._read, args=(requests, subscribed), daemon=True).start()
        sent_version: str | None = None
        while context.is_active():
            with self._changed:
                self._changed.wait_for(partial(self._wake, subscribed, sent_version), timeout=0.2)
                if self._stopping:
                    return
                snapshot = self._snapshot if subscribed.is_set() else None
            if snapshot is None or snapshot.version == sent_version:
                continue
            nonce = str(next(self._nonces))
            self._sent.setdefault(snapshot.version, set()).add(nonce)
            sent_version = snapshot.version
            yield Response(
                version_info=snapshot.version,
                resources=snapshot.resources,
                type_url=RESOURCE_TYPE,
                nonce=nonce,
            )

    def _wake(self, subscribed: threading.Event, sent_version: str | None) -> bool:
        """Stopping, or a snapshot this subscribed stream has not been sent yet."""
        if self._stopping:
            return True
        snapshot = self._snapshot
        return subscribed.is_set() and snapshot is not None and snapshot.version != sent_version

    def _read(self, requests: Iterator[Request], subscribed: threading.Event) -> None:
        try:
            for request in requests:
                self.requests.append(request)
                if request.type_url == RESOURCE_TYPE:
                    subscribed.set()
                with self._changed:
                    self._changed.notify_all()
        except grpc.RpcError:
            return  # the stream ended: stop() or the client went away


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, server: AdsServer) -> None:
        self._server = server

    def StreamAggregatedResources(self, request_iterator: Any, context: Any) -> Any:
        return self._server._stream(request_iterator, context)


def _common_name(context: grpc.ServicerContext) -> str:
    names = context.auth_context().get("x509_common_name", [])
    return names[0].decode() if names else ""
