"""One sidecar process: startup, main loop, graceful shutdown (after uvicorn's Server)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from grpc_health.v1 import health_pb2
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.core import FleetLimiter, Limiter, LocalLimiter, SyncStats
from ratelimit_sidecar.grpc_server.rlqs import quota_wiring
from ratelimit_sidecar.grpc_server.rls import BindError, RateLimitServicer, build_server
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.tracing import TracedServicer, tracing_for
from ratelimit_sidecar.grpc_server.transport.options import PORT_DEFAULTS, PortOptions
from ratelimit_sidecar.grpc_server.transport.server import FastServer
from ratelimit_sidecar.http_server.admin import AdminServer
from ratelimit_sidecar.http_server.debug import MAX_JSON_BYTES, DebugApi
from ratelimit_sidecar.http_server.endpoints import HEALTH_PATHS, Endpoints
from ratelimit_sidecar.http_server.server import HttpApi, Reply
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.follower import follow_overrides
from ratelimit_sidecar.overrides.keeper import keeper_for
from ratelimit_sidecar.rules.source import rule_source
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.response import ResponseOptions
from ratelimit_sidecar.service.strict import StrictDecider
from ratelimit_sidecar.service.validation import Bounds
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.strict_store import StrictStore
from ratelimit_sidecar.sync.fleet_blocks import wire_blocks
from ratelimit_sidecar.sync.span_sync import SyncLoop
from ratelimit_sidecar.sync.store_clock import StoreClock, monotonic_wall_ms
from ratelimit_sidecar.sync.sweeper import SweepLoop

log = logging.getLogger("ratelimit_sidecar.server")

PREPARE_TIMEOUT_S = 2.0  # Redis down at start: strict rules start on their on_store_failure
# gRPC health answers for the whole server ("") and, as the reference does, for "ratelimit".
HEALTH_NAMES = ("", "ratelimit")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Sidecar:
    """Owns the limiter, the gRPC server and the sync loop of one node."""

    def __init__(
        self,
        settings: Settings,
        rules: RuleSet,
        storage: Storage | None = None,
        *,
        clock_ms: Callable[[], int] = monotonic_wall_ms,
        metrics: Metrics | None = None,
        reuse_port: bool = False,
        tls: ServerTls | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.tracing = tracing_for(settings)  # None unless --tracing: nothing on the way then
        self.tls = tls  # the gRPC port's TLS, None for plaintext
        if tls is not None:
            tls.on_error = self.metrics.tls_reload_errors.inc
        # Spans follow the shared store's clock (Redis TIME); `clock_ms` is the local clock it
        # corrects. Requests read it without I/O; the sync loop updates the offset.
        self.clock = StoreClock(clock_ms)
        clock_ms = self.clock.now_ms
        self.storage = storage
        self.limiter: Limiter
        self.sync: SyncLoop | SweepLoop
        if storage is None:  # local-only: counts stay in memory, nothing to sync
            local = LocalLimiter(settings.max_keys)
            self.limiter, self.sync = local, SweepLoop(local, clock_ms)
        else:
            fleet = FleetLimiter(
                settings.max_keys,
                quiet_share=settings.quiet_share,
                new_keys_alone=not settings.new_keys_even_split,
                key_digest=digest,  # the store's near notices name keys so
            )
            timeout = settings.sync_timeout_ms
            self.limiter, self.sync = (
                fleet,
                SyncLoop(fleet, storage, clock_ms, timeout, self._synced, store_clock=self.clock),
            )
        # Blocks other nodes' pushes start reach this one at once (pub/sub), not at its span end.
        self.subscriber, self.blocks = wire_blocks(
            storage, self.limiter, clock_ms, self.metrics.registry
        )
        self.strict_store: StrictStore | None = None
        self.strict = self._strict_decider(settings, storage)
        self.handler = RateLimitHandler(
            rules,
            self.limiter,
            clock_ms,
            bounds=Bounds(settings.max_descriptors, settings.max_entries, settings.max_value_bytes),
            # Shadow and quota mode settle the overall code (service/overall.py), after the
            # limiter has decided and counted as usual.
            options=ResponseOptions(
                settings.ietf_headers,
                shadow_mode=settings.shadow_mode,
                quota_mode=settings.quota_mode,
                dynamic_metadata=settings.response_dynamic_metadata,
                reference_headers=_header_names(settings),
            ),
            observer=self.metrics,
            cache_entries=settings.max_keys,  # one compiled request per tracked counter
            strict=self.strict,
        )
        # Runtime overrides (admin API): kept across reloads, applied before /readyz answers.
        self.overrides = keeper_for(
            settings, storage, self.handler.swap_overrides, clock_ms, self.metrics
        )
        # Shared overrides: a change announced on Redis is read at once (overrides/follower.py),
        # on the node's one pub/sub connection (made above for blocks when counts go to Redis).
        self.subscriber, self.follower = follow_overrides(
            storage, self.overrides, clock_ms, self.subscriber
        )
        self.admin = AdminServer(settings, self.overrides, clock_ms, self.metrics)
        self.metrics.watch(self.limiter, lambda: self.sync.store_up, clock_ms)
        self.metrics.config_loaded(True, rules.version)
        # Rule files (watched) or an xDS control plane: each new rule set is swapped in whole.
        self.watcher = rule_source(
            settings,
            self.swap_rules,
            lambda _error: self.metrics.config_loaded(False),
            self.metrics.registry,
        )
        mode = "local-only" if storage is None else storage.description
        self.endpoints = endpoints = Endpoints(
            lambda: self.handler.rules,
            self.limiter,
            self.sync,
            mode,
            show_values=settings.debug_show_values,
            overrides=self.overrides.view,
            source=self.watcher.view,
        )
        routes = endpoints.routes(self._scrape)
        self.http = HttpApi(routes)
        # Probes on a port of their own, as the reference serves them (its PORT, 8080).
        self.health_http = HttpApi({path: routes[path] for path in HEALTH_PATHS})
        debug = DebugApi(lambda: self.handler.rules, self.handler.respond)
        self.debug = HttpApi(dispatch=debug.dispatch, max_body=MAX_JSON_BYTES)
        # Envoy's Rate Limit Quota Service, on the gRPC server of ShouldRateLimit.
        self.quota, self._add_quota = quota_wiring(
            lambda: self.handler.rules, self.limiter, clock_ms, settings, self.metrics.registry,
            overrides=lambda: self.handler.api_overrides,
        )  # fmt: skip
        self._reuse_port = reuse_port
        self._exit = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: Any = None  # grpc.aio.Server or the fast transport's FastServer
        self.port = 0

    def _strict_decider(self, settings: Settings, storage: Storage | None) -> StrictDecider | None:
        """Strict rules check Redis on the request path. Without Redis (local-only) the limiter
        decides them with their own algorithm, which is exact on one node."""
        if not isinstance(storage, RedisStorage):
            return None
        self.strict_store = StrictStore(storage)
        decider = StrictDecider(
            self.limiter,
            self.strict_store,
            timeout_ms=settings.strict_timeout_ms,
            observer=self.metrics,
        )
        self.metrics.watch_breaker(lambda: decider.breaker.state)
        return decider

    async def startup(self) -> None:
        """Bind and start serving; raises BindError if the address is not available."""
        observe = self.metrics.decision_seconds.observe
        servicer = (
            RateLimitServicer(self.handler, observe)
            if self.tracing is None
            else TracedServicer(self.handler, observe, self.tracing)
        )
        server, health, self.port = build_server(
            servicer,
            self.settings.grpc_address,
            self._reuse_port,
            (self._add_quota,),
            transport=self.settings.transport,
            tls=self.tls,
            options=port_options(self.settings),
        )
        if isinstance(server, FastServer):  # its bounds' trips, read at scrape time
            self.metrics.watch_grpc_port(server.port_state.trips, server.port_state.pending_bytes)
        await self.overrides.start()
        await _listen(self.http, self.settings.metrics_address, "metrics")
        await self.admin.start()
        if self.settings.health_address:
            await _listen(self.health_http, self.settings.health_address, "health")
        if self.settings.debug_address:
            await _listen(self.debug, self.settings.debug_address, "debug")
        if self.strict_store is not None:  # slot map and script, before the first request
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.strict_store.prepare(), PREPARE_TIMEOUT_S)
        await server.start()
        self._server, self._health = server, health
        for name in HEALTH_NAMES:
            await health.set(name, SERVING)
        self._tasks.append(asyncio.create_task(self.sync.run(), name="sync-loop"))
        self._tasks.append(asyncio.create_task(self.watcher.run(), name="rule-watcher"))
        self._tasks.append(asyncio.create_task(self.overrides.run(), name="overrides"))
        if self.subscriber is not None:
            self._tasks.append(asyncio.create_task(self.subscriber.run(), name="subscriber"))
        # Everything built so far (rules, protobuf descriptors, metrics) lives until exit: move it
        # out of the cyclic collector's reach, so its collections scan only what requests create.
        gc.freeze()
        self._log_startup()

    def swap_rules(self, rules: RuleSet) -> None:
        """Install a new rule set in one step; counters of unchanged rules carry over."""
        self.handler.swap_rules(rules)
        self.metrics.config_loaded(True, rules.version)

    def _synced(self, stats: SyncStats, seconds: float, error_kind: str) -> None:
        self.metrics.synced(stats, seconds, error_kind)
        if self.tracing is not None:
            self.tracing.synced(stats, seconds, error_kind)

    def _scrape(self, _query: dict[str, list[str]]) -> Reply:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)

    def _log_startup(self) -> None:
        s = self.settings
        store = self.storage
        mode = "local-only (single node, no Redis)" if store is None else store.description
        domains = self.handler.rules.domains.values()
        rules = sum(len(d.rules()) for d in domains)
        host = s.grpc_address.rsplit(":", 1)[0]
        transport = "fast" if isinstance(self._server, FastServer) else "grpcio"
        log.info(
            "serving on %s:%d (%s transport; metrics on port %d); mode %s; node %s;"
            " %d domains, %d rules%s; %s",
            host, self.port, transport, self.http.port, mode, s.node_id, len(domains), rules,
            "; shadow mode" if s.shadow_mode else "", self.admin.describe(),
        )  # fmt: skip

    def request_exit(self) -> None:
        self._exit.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_exit)

    async def serve(self) -> None:
        await self.startup()
        self.install_signal_handlers()
        await self._exit.wait()
        await self.shutdown()

    async def shutdown(self) -> int:
        """Stop accepting, finish in-flight requests, push every admitted hit, close the store.

        Returns the hits that could not be pushed (0 unless the store is down).
        """
        log.info("shutting down: draining requests and flushing counts")
        self.endpoints.serving = False
        if self._server is not None:
            for name in HEALTH_NAMES:
                await self._health.set(name, NOT_SERVING)
            self.quota.end_streams()  # RLQS streams last for ever: end them, counted
            await self._server.stop(self.settings.shutdown_grace_s)
        self.sync.stop()
        self.watcher.stop()
        self.overrides.stop()
        if self.subscriber is not None:
            self.subscriber.stop()
        for task in self._tasks:
            await task
        lost = await self.sync.flush()
        if self.follower is not None:
            await self.follower.stop()
        await self.overrides.close()
        if self.storage is not None:
            await self.storage.close()
        await self.admin.stop()
        await self.debug.stop()
        await self.health_http.stop()
        await self.http.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the spans still queued
        log.info("stopped")
        return lost


def _header_names(settings: Settings) -> tuple[str, str, str] | None:
    if not settings.limit_response_headers:
        return None
    limit, remaining, reset = (n.strip() for n in settings.limit_response_header_names.split(","))
    return limit, remaining, reset


def _max_age(settings: Settings) -> tuple[float, float] | None:
    age = settings.grpc_max_connection_age_s
    return None if age is None else (age, settings.grpc_max_connection_age_grace_s)


def port_options(settings: Settings) -> PortOptions:
    """The gRPC port's bounds. Its largest message follows from the request bounds (RLQS
    reports are held to the same size)."""
    bounds = Bounds(settings.max_descriptors, settings.max_entries, settings.max_value_bytes)
    limits = replace(
        PORT_DEFAULTS.limits,
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
        max_message_bytes=bounds.max_request_bytes(),
        unary_receive_timeout_s=settings.grpc_receive_timeout_s,
        stream_idle_timeout_s=settings.grpc_stream_idle_timeout_s,
    )
    return PortOptions(
        limits=limits,
        pending_bytes=settings.grpc_pending_bytes,
        max_connections=settings.grpc_max_connections,
        max_connections_per_peer=settings.grpc_max_connections_per_peer,
        tls_handshake_timeout_s=settings.grpc_tls_handshake_timeout_s,
        max_age=_max_age(settings),
    )


async def _listen(api: HttpApi, address: str, role: str) -> None:
    try:
        await api.start(address)
    except OSError as exc:
        raise BindError(f"cannot listen on {address} ({role}): {exc.strerror}") from exc
