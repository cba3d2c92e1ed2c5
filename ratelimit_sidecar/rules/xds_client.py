"""Rules from an xDS control plane: a state-of-the-world ADS stream of `RateLimitConfig`.

The protocol, as Envoy's xDS clients speak it: subscribe to every resource of the type (a
wildcard: no names) with the last accepted version; each response is the whole set. A set that
validates replaces the rules in one swap (`on_rules`, like a file reload) and is ACKed with its
version and nonce; one that does not is NACKed: the nonce, the last accepted version, and an
`error_detail` naming each resource and field at fault, while the last good rules keep deciding.
After a stream error the client reconnects with jittered exponential backoff (`Backoff`), never
in a loop, serving the last rules meanwhile; a rotated TLS file ends the stream at once so the
next connection uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
from google.rpc import status_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge

from ratelimit_sidecar._proto.envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.config.xds_rules import (
    RESOURCE_TYPE,
    problem_text,
    rules_from_configs,
    unpack,
)
from ratelimit_sidecar.metrics.labels import NS
from ratelimit_sidecar.periodic import every
from ratelimit_sidecar.rules.reload import RuleLoading, in_daemon_thread
from ratelimit_sidecar.rules.xds_channel import Backoff, XdsOptions, node_of, open_channel

log = logging.getLogger("ratelimit_sidecar.xds")

INVALID_ARGUMENT = 3  # google.rpc.Code of a NACK
TLS_WORDS = ("ssl", "tls", "handshake", "certificate")


class XdsMetrics:
    """The rule source's own metrics, on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            f"{NS}_config_source_connected", "1 while the xDS stream is up", registry=registry
        )
        self.version = Gauge(
            f"{NS}_xds_accepted_version_info", "Last accepted xDS version", ("version",),
            registry=registry,
        )  # fmt: skip
        self.responses = Counter(
            f"{NS}_xds_responses", "xDS responses by answer (ack, nack)", ("answer",),
            registry=registry,
        )  # fmt: skip
        for answer in ("ack", "nack"):  # both shown from the start, at 0
            self.responses.labels(answer)
        self.attempts = Counter(
            f"{NS}_xds_connect_attempts", "Streams opened to the control plane", registry=registry
        )
        self._shown = ""

    def accepted(self, version: str) -> None:
        self.responses.labels("ack").inc()
        with contextlib.suppress(KeyError):
            self.version.remove(self._shown)
        self.version.labels(version).set(1)
        self._shown = version


class XdsRuleSource:
    """Follows the control plane at `options.url`; `run` until `stop`."""

    def __init__(
        self,
        options: XdsOptions,
        loading: RuleLoading,
        on_rules: Callable[[RuleSet], None],
        on_error: Callable[[str], None],
        *,
        registry: CollectorRegistry,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = options.url
        self._options, self._loading = options, loading
        self._on_rules, self._on_error = on_rules, on_error
        self._node = node_of(options)
        self._tls = options.tls
        self.backoff = backoff or Backoff(options.retry_s, options.retry_max_s)
        self.metrics = XdsMetrics(registry)
        self.connected = False
        self.accepted_version = ""  # what a new stream subscribes with
        self.received = False  # a configuration was accepted since start
        self.last_error = ""
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def view(self) -> dict[str, object]:
        """Where the rules come from, for /debug/rules and /readyz."""
        return {
            "type": "xds",
            "url": self.url,
            "connected": self.connected,
            "accepted_version": self.accepted_version,
            "last_error": self.last_error,
            "ready": self.received or self._options.ready_without_config,
        }

    async def run(self) -> None:
        log.info("rules from xDS control plane %s (node %s)", self.url, self._node.id)
        while not self._stop.is_set():
            self.metrics.attempts.inc()
            failure = await self._attempt()
            self._set_connected(False)
            if self._stop.is_set():
                return
            delay = 0.0 if failure is None else self.backoff.next_delay()
            if failure is not None:
                self._log_failure(failure, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def _attempt(self) -> str | None:
        """One stream, to its end: None if it ended for a TLS rotation (reconnect now), else
        why it ended."""
        try:
            channel = open_channel(self.url, self._tls)
        except OSError as exc:
            return f"cannot read the TLS files: {exc}"
        async with channel:
            call = ads_stub(channel).StreamAggregatedResources()
            watcher = asyncio.create_task(self._end_on_stop_or_rotation(call))
            try:
                return await self._follow(call)
            except grpc.aio.AioRpcError as exc:
                return _rpc_failure(exc, self._tls is not None)
            except asyncio.CancelledError:
                if watcher.done() and watcher.result():
                    return None  # rotation: reconnect at once
                if self._stop.is_set():
                    return "stopped"
                raise
            finally:
                watcher.cancel()

    async def _follow(self, call: grpc.aio.StreamStreamCall) -> str:
        await call.write(self._request(self.accepted_version))
        await call.wait_for_connection()
        self._set_connected(True)
        log.info(
            "xDS stream to %s open (subscribed at version '%s')", self.url, self.accepted_version
        )
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                return "the control plane closed the stream"
            self.backoff.reset()
            await call.write(await self._answer(response))

    async def _answer(
        self, response: discovery_pb2.DiscoveryResponse
    ) -> discovery_pb2.DiscoveryRequest:
        """The ACK or NACK of one response, after installing its rules if they validate."""
        version, nonce = response.version_info, response.nonce
        try:
            if response.type_url != RESOURCE_TYPE:
                raise ValueError(f"type_url '{response.type_url}' was not subscribed to")
            rules = await self._convert(response)
        except (ConfigError, ValueError) as exc:
            detail = problem_text(exc.problems) if isinstance(exc, ConfigError) else str(exc)
            log.error(
                "xDS version '%s' refused (NACK), keeping the last good rules: %s", version, detail
            )
            self.metrics.responses.labels("nack").inc()
            self.last_error = detail
            self._on_error(detail)
            error = status_pb2.Status(code=INVALID_ARGUMENT, message=detail)
            return self._request(self.accepted_version, nonce, error)
        self._on_rules(rules)
        self.accepted_version, self.received, self.last_error = version, True, ""
        self.metrics.accepted(version)
        log.info("xDS version '%s' accepted (ACK): %d domains", version, len(rules.domains))
        return self._request(version, nonce)

    async def _convert(self, response: discovery_pb2.DiscoveryResponse) -> RuleSet:
        """The response's rule set, built in a thread so requests keep being answered."""
        configs = unpack(response.resources)
        abandoned = threading.Event()
        loading = self._loading
        work = partial(
            rules_from_configs, configs, loading.limits, loading.defaults, abandoned.is_set
        )
        try:
            return await in_daemon_thread(work)
        finally:
            abandoned.set()  # ends the load at once if this task was cancelled meanwhile

    def _request(
        self, version: str, nonce: str = "", error: status_pb2.Status | None = None
    ) -> discovery_pb2.DiscoveryRequest:
        request = discovery_pb2.DiscoveryRequest(
            version_info=version, node=self._node, type_url=RESOURCE_TYPE, response_nonce=nonce
        )
        if error is not None:
            request.error_detail.CopyFrom(error)
        return request

    async def _end_on_stop_or_rotation(self, call: grpc.aio.StreamStreamCall) -> bool:
        """Cancel the stream on stop (False) or when a TLS file changes (True)."""
        first = self._tls.fingerprint() if self._tls is not None else ()
        async for _ in every(self._loading.poll_s, self._stop):
            if self._tls is not None and self._tls.fingerprint() != first:
                log.info("xDS TLS files changed: reconnecting with them")
                call.cancel()
                return True
        call.cancel()
        return False

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.metrics.connected.set(int(connected))

    def _log_failure(self, reason: str, delay: float) -> None:
        log.warning(
            "xDS control plane %s: %s; keeping the last rules (version '%s'), retry %d in %.1f s",
            self.url, reason, self.accepted_version, self.backoff.failures, delay,
        )  # fmt: skip


def ads_stub(channel: grpc.aio.Channel) -> Any:
    """The ADS client on `channel` (the generated stub class has no type hints)."""
    return ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)  # type: ignore[no-untyped-call]


def _rpc_failure(exc: grpc.aio.AioRpcError, tls: bool) -> str:
    details = exc.details() or ""
    if tls and any(word in details.lower() for word in TLS_WORDS):
        return (
            "TLS handshake failed (is the control plane's certificate signed by"
            f" CONFIG_GRPC_XDS_SERVER_TLS_CACERT, for CONFIG_GRPC_XDS_SERVER_TLS_SAN?): {details}"
        )
    return f"stream failed: {exc.code().name}: {details}"
