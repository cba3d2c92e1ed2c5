"""One function per part of a sidecar: each takes the settings and the parts it works with, and
hands back the part built (after uvicorn's Config: the Sidecar only runs what these make).

Each component gets its own options from app/options.py, never the settings themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry

from ratelimit_sidecar.app.options import (
    port_options,
    quota_policy,
    request_bounds,
    response_options,
    rule_loading,
    server_tls_files,
    tracing_options,
    xds_options,
)
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.core import FleetLimiter, Limiter, LocalLimiter, SyncStats
from ratelimit_sidecar.grpc_server.rlqs import QuotaServicer, quota_wiring
from ratelimit_sidecar.grpc_server.rls import RateLimitServicer, build_server
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.tracing import TracedServicer, Tracing
from ratelimit_sidecar.http_server.debug import MAX_JSON_BYTES, DebugApi, Respond
from ratelimit_sidecar.http_server.endpoints import HEALTH_PATHS, Endpoints
from ratelimit_sidecar.http_server.server import HttpApi, Route
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.keeper import OverrideKeeper
from ratelimit_sidecar.rules.source import RuleSource, rule_source
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.strict import StrictDecider
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.strict_store import StrictStore
from ratelimit_sidecar.sync.span_sync import SyncLoop
from ratelimit_sidecar.sync.store_clock import StoreClock
from ratelimit_sidecar.sync.sweeper import SweepLoop

SyncReport = Callable[[SyncStats, float, str], None]


def server_tls(settings: Settings) -> ServerTls | None:
    """The gRPC port's TLS, None for plaintext; TlsError for a file that cannot be used."""
    files = server_tls_files(settings)
    return None if files is None else ServerTls(files)


def build_tracing(settings: Settings) -> Tracing | None:
    """The tracer, None unless `--tracing`: nothing on the way then."""
    return Tracing(tracing_options(settings)) if settings.tracing else None


def build_limiter(
    settings: Settings, storage: Storage | None, clock: StoreClock, on_synced: SyncReport
) -> tuple[Limiter, SyncLoop | SweepLoop]:
    """The limiter and its loop: counts synced through `storage`, or, local-only (no storage),
    kept in memory and swept."""
    if storage is None:
        local = LocalLimiter(settings.max_keys)
        return local, SweepLoop(local, clock.now_ms)
    fleet = fleet_limiter(settings)
    timeout = settings.sync_timeout_ms
    return fleet, SyncLoop(fleet, storage, clock.now_ms, timeout, on_synced, store_clock=clock)


def fleet_limiter(settings: Settings) -> FleetLimiter:
    return FleetLimiter(
        settings.max_keys,
        quiet_share=settings.quiet_share,
        new_keys_alone=not settings.new_keys_even_split,
        key_digest=digest,  # the store's near notices name keys so
    )


def build_strict(
    settings: Settings, storage: Storage | None, limiter: Limiter, metrics: Metrics
) -> tuple[StrictStore | None, StrictDecider | None]:
    """Strict rules check Redis on the request path. Without Redis (local-only) the limiter
    decides them with their own algorithm, which is exact on one node: (None, None)."""
    if not isinstance(storage, RedisStorage):
        return None, None
    store = StrictStore(storage)
    timeout_ms = settings.strict_timeout_ms
    decider = StrictDecider(limiter, store, timeout_ms=timeout_ms, observer=metrics)
    metrics.watch_breaker(lambda: decider.breaker.state)
    return store, decider


def build_handler(
    settings: Settings,
    rules: RuleSet,
    limiter: Limiter,
    clock_ms: Callable[[], int],
    *,
    metrics: Metrics,
    strict: StrictDecider | None,
) -> RateLimitHandler:
    """ShouldRateLimit's handler, on the first rules (swapped whole at each reload)."""
    return RateLimitHandler(
        rules,
        limiter,
        clock_ms,
        bounds=request_bounds(settings),
        options=response_options(settings),
        observer=metrics,
        cache_entries=settings.max_keys,  # one compiled request per tracked counter
        strict=strict,
    )


def build_rule_source(
    settings: Settings,
    on_rules: Callable[[RuleSet], None],
    on_error: Callable[[str], None],
    registry: CollectorRegistry,
) -> RuleSource:
    """Rule files (watched) or an xDS control plane: each new rule set is swapped in whole."""
    xds = None if settings.xds_url is None else xds_options(settings)
    loading = rule_loading(settings)
    return rule_source(
        settings.config_path, xds, loading, on_rules=on_rules, on_error=on_error, registry=registry
    )


def build_endpoints(
    settings: Settings,
    storage: Storage | None,
    rules: Callable[[], RuleSet],
    limiter: Limiter,
    sync: SyncLoop | SweepLoop,
    *,
    overrides: OverrideKeeper,
    source: RuleSource,
) -> Endpoints:
    """Health, readiness and the read-only views of the metrics address."""
    mode = "local-only" if storage is None else storage.description
    return Endpoints(
        rules,
        limiter,
        sync,
        mode,
        show_values=settings.debug_show_values,
        overrides=overrides.view,
        source=source.view,
    )


def metrics_apis(routes: dict[str, Route]) -> tuple[HttpApi, HttpApi]:
    """The metrics address, and the probes alone for a port of their own, as the reference
    serves them (its PORT, 8080)."""
    return HttpApi(routes), HttpApi({path: routes[path] for path in HEALTH_PATHS})


def debug_api(rules: Callable[[], RuleSet], respond: Respond) -> HttpApi:
    """The reference's debug address: /rlconfig and POST /json."""
    return HttpApi(dispatch=DebugApi(rules, respond).dispatch, max_body=MAX_JSON_BYTES)


def build_quota(
    settings: Settings,
    rules: Callable[[], RuleSet],
    limiter: Limiter,
    clock_ms: Callable[[], int],
    registry: CollectorRegistry,
    *,
    overrides: Callable[[], AppliedOverrides],
) -> tuple[QuotaServicer, Callable[[Any], str]]:
    """Envoy's Rate Limit Quota Service, and the hook adding it to ShouldRateLimit's server."""
    bounds, policy = request_bounds(settings), quota_policy(settings)
    return quota_wiring(
        rules, limiter, clock_ms, registry, bounds=bounds, policy=policy, overrides=overrides
    )


def rls_servicer(
    handler: RateLimitHandler, observe: Callable[[float], None], tracing: Tracing | None
) -> RateLimitServicer:
    """ShouldRateLimit's servicer; in a span per call with tracing on."""
    if tracing is None:
        return RateLimitServicer(handler, observe)
    return TracedServicer(handler, observe, tracing)


def build_grpc_server(
    settings: Settings,
    servicer: RateLimitServicer,
    add_quota: Callable[[Any], str],
    *,
    reuse_port: bool,
    tls: ServerTls | None,
) -> tuple[Any, HealthServicer, int]:
    """The gRPC port, bound (BindError if it cannot be): ShouldRateLimit, RLQS, health."""
    return build_server(
        servicer,
        settings.grpc_address,
        reuse_port,
        (add_quota,),
        transport=settings.transport,
        tls=tls,
        options=port_options(settings),
    )
