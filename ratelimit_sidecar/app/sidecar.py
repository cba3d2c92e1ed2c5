"""One sidecar process: startup, main loop, graceful shutdown (after uvicorn's Server)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from grpc_health.v1 import health_pb2
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ratelimit_sidecar.app.builder import (
    build_endpoints,
    build_grpc_server,
    build_handler,
    build_limiter,
    build_quota,
    build_rule_source,
    build_strict,
    build_tracing,
    debug_api,
    metrics_apis,
    rls_servicer,
)
from ratelimit_sidecar.app.options import admin_options, override_options
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.bind import BindError
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.core import SyncStats
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.transport.server import FastServer
from ratelimit_sidecar.http_server.admin import AdminServer
from ratelimit_sidecar.http_server.server import HttpApi, Reply
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.follower import follow_overrides
from ratelimit_sidecar.overrides.keeper import keeper_for
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.sync.fleet_blocks import wire_blocks
from ratelimit_sidecar.sync.store_clock import StoreClock, monotonic_wall_ms

log = logging.getLogger("ratelimit_sidecar.server")

PREPARE_TIMEOUT_S = 2.0  # Redis down at start: strict rules start on their on_store_failure
# gRPC health answers for the whole server ("") and, as the reference does, for "ratelimit".
HEALTH_NAMES = ("", "ratelimit")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Sidecar:
    """One node: its parts built in named steps (each by app/builder.py), then run: `startup`,
    `serve` until a signal, `shutdown` (after uvicorn's Server)."""

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
        self.settings, self.storage = settings, storage
        self.metrics = metrics or Metrics()
        self.tracing = build_tracing(settings)
        self.tls = self._count_tls_reload_errors(tls)  # the gRPC port's TLS, None for plaintext
        # Spans follow the shared store's clock (Redis TIME); `clock_ms` is the local clock it
        # corrects. Requests read it without I/O; the sync loop updates the offset.
        self.clock = StoreClock(clock_ms)
        self._build_limiter()
        self._build_handler(rules)
        self._build_overrides()
        self._build_rule_source(rules)
        self._build_http()
        self._build_quota()
        self._reuse_port = reuse_port
        self._exit = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: Any = None  # grpc.aio.Server or the fast transport's FastServer
        self.port = 0

    def _count_tls_reload_errors(self, tls: ServerTls | None) -> ServerTls | None:
        if tls is not None:
            tls.on_error = self.metrics.tls_reload_errors.inc
        return tls

    def _build_limiter(self) -> None:
        """The limiter and its sync loop (a sweep, local-only), watched by the metrics; blocks
        other nodes' pushes start reach this node at once (pub/sub), not at its span end."""
        clock_ms, registry = self.clock.now_ms, self.metrics.registry
        built = build_limiter(self.settings, self.storage, self.clock, self._synced)
        self.limiter, self.sync = built
        self.subscriber, self.blocks = wire_blocks(self.storage, self.limiter, clock_ms, registry)
        self.metrics.watch(self.limiter, self._store_up, clock_ms)

    def _build_handler(self, rules: RuleSet) -> None:
        """The request path: the strict rules' store and decider (Redis only), the handler."""
        self.strict_store, self.strict = build_strict(
            self.settings, self.storage, self.limiter, self.metrics
        )
        self.handler = build_handler(
            self.settings, rules, self.limiter, self.clock.now_ms,
            metrics=self.metrics, strict=self.strict,
        )  # fmt: skip

    def _build_overrides(self) -> None:
        """Runtime overrides (admin API): kept across reloads, applied before /readyz answers.
        Shared ones: a change announced on Redis is read at once (overrides/follower.py), on
        the node's one pub/sub connection (made for blocks when counts go to Redis)."""
        clock_ms, apply = self.clock.now_ms, self.handler.swap_overrides
        options = override_options(self.settings)
        self.overrides = keeper_for(options, self.storage, apply, clock_ms, self.metrics)
        self.subscriber, self.follower = follow_overrides(
            self.storage, self.overrides, clock_ms, self.subscriber
        )
        admin = admin_options(self.settings)
        self.admin = AdminServer(admin, self.overrides, clock_ms, self.metrics)

    def _build_rule_source(self, rules: RuleSet) -> None:
        """The first rules counted as loaded; rule files (watched) or xDS bring the next ones."""
        self.metrics.config_loaded(True, rules.version)
        self.watcher = build_rule_source(
            self.settings, self.swap_rules, self._rules_failed, self.metrics.registry
        )

    def _build_http(self) -> None:
        """The metrics address with its views, its probes again on a port of their own, and
        the debug address."""
        self.endpoints = build_endpoints(
            self.settings, self.storage, self.current_rules, self.limiter, self.sync,
            overrides=self.overrides, source=self.watcher,
        )  # fmt: skip
        self.http, self.health_http = metrics_apis(self.endpoints.routes(self._scrape))
        self.debug = debug_api(self.current_rules, self.handler.respond)

    def _build_quota(self) -> None:
        """Envoy's Rate Limit Quota Service, on the gRPC server of ShouldRateLimit: it reads
        the live rules and runtime overrides at each report."""
        self.quota, self._add_quota = build_quota(
            self.settings, self.current_rules, self.limiter, self.clock.now_ms,
            self.metrics.registry, overrides=self.api_overrides,
        )  # fmt: skip

    def current_rules(self) -> RuleSet:
        """The rules in force (a reload swaps them in the handler)."""
        return self.handler.rules

    def api_overrides(self) -> AppliedOverrides:
        """The runtime overrides in force."""
        return self.handler.api_overrides

    async def startup(self) -> None:
        """Bind and start serving; raises BindError if an address is not available."""
        servicer = rls_servicer(self.handler, self.metrics.decision_seconds.observe, self.tracing)
        server, health, self.port = build_grpc_server(
            self.settings, servicer, self._add_quota, reuse_port=self._reuse_port, tls=self.tls
        )
        if isinstance(server, FastServer):  # its bounds' trips, read at scrape time
            self.metrics.watch_grpc_port(server.port_state.trips, server.port_state.pending_bytes)
        await self.overrides.start()
        await self._listen_http()
        await self._prepare_strict_store()
        await server.start()
        self._server, self._health = server, health
        for name in HEALTH_NAMES:
            await health.set(name, SERVING)
        self._start_tasks()
        # Everything built so far (rules, protobuf descriptors, metrics) lives until exit: move it
        # out of the cyclic collector's reach, so its collections scan only what requests create.
        gc.freeze()
        self._log_startup()

    async def _listen_http(self) -> None:
        """The metrics address, the admin API (if it has a token), and the probe and debug
        addresses when they are set."""
        settings = self.settings
        await _listen(self.http, settings.metrics_address, "metrics")
        await self.admin.start()
        if settings.health_address:
            await _listen(self.health_http, settings.health_address, "health")
        if settings.debug_address:
            await _listen(self.debug, settings.debug_address, "debug")

    async def _prepare_strict_store(self) -> None:
        """The slot map and script, before the first request (bounded: see PREPARE_TIMEOUT_S)."""
        if self.strict_store is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.strict_store.prepare(), PREPARE_TIMEOUT_S)

    def _start_tasks(self) -> None:
        """The background loops, each a task `shutdown` stops and awaits."""
        loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("sync-loop", self.sync.run),
            ("rule-watcher", self.watcher.run),
            ("overrides", self.overrides.run),
        ]
        if self.subscriber is not None:
            loops.append(("subscriber", self.subscriber.run))
        self._tasks += [asyncio.create_task(run(), name=name) for name, run in loops]

    def swap_rules(self, rules: RuleSet) -> None:
        """Install a new rule set in one step; counters of unchanged rules carry over."""
        self.handler.swap_rules(rules)
        self.metrics.config_loaded(True, rules.version)

    def _synced(self, stats: SyncStats, seconds: float, error_kind: str) -> None:
        self.metrics.synced(stats, seconds, error_kind)
        if self.tracing is not None:
            self.tracing.synced(stats, seconds, error_kind)

    def _store_up(self) -> bool:
        return self.sync.store_up

    def _rules_failed(self, _error: str) -> None:
        self.metrics.config_loaded(False)

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
        await self._stop_grpc()
        await self._stop_loops()
        lost = await self.sync.flush()
        await self._close()
        log.info("stopped")
        return lost

    async def _stop_grpc(self) -> None:
        """Health says NOT_SERVING, RLQS streams end, calls in flight get the grace period."""
        if self._server is None:
            return
        for name in HEALTH_NAMES:
            await self._health.set(name, NOT_SERVING)
        self.quota.end_streams()  # RLQS streams last for ever: end them, counted
        await self._server.stop(self.settings.shutdown_grace_s)

    async def _stop_loops(self) -> None:
        self.sync.stop()
        self.watcher.stop()
        self.overrides.stop()
        if self.subscriber is not None:
            self.subscriber.stop()
        for task in self._tasks:
            await task

    async def _close(self) -> None:
        """The store's connections, the HTTP listeners, then the spans still queued."""
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
            await asyncio.to_thread(self.tracing.shutdown)


async def _listen(api: HttpApi, address: str, role: str) -> None:
    try:
        await api.start(address)
    except OSError as exc:
        raise BindError(f"cannot listen on {address} ({role}): {exc.strerror}") from exc
