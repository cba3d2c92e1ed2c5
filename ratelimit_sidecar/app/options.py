"""The settings turned into each component's own options: the one place that reads a flag for
a component below `app/`.

The packages below take small typed values (`TlsFiles`, `TracingOptions`, `XdsOptions`, ...)
and never see `Settings`; one function here per component says which flags make its options.
Nothing here reads a file or opens a socket (app/builder.py does, with these).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config.limits import ConfigLimits
from ratelimit_sidecar.core.quota_assign import QuotaPolicy
from ratelimit_sidecar.grpc_server.tls import TlsFiles
from ratelimit_sidecar.grpc_server.tracing import TracingOptions
from ratelimit_sidecar.grpc_server.transport.options import PORT_DEFAULTS, PortOptions
from ratelimit_sidecar.http_server.admin import AdminOptions
from ratelimit_sidecar.overrides.keeper import OverrideOptions
from ratelimit_sidecar.overrides.model import OverrideBounds
from ratelimit_sidecar.rules.reload import RuleLoading
from ratelimit_sidecar.rules.xds_channel import TlsFiles as XdsTlsFiles
from ratelimit_sidecar.rules.xds_channel import XdsOptions
from ratelimit_sidecar.service.response import ResponseOptions
from ratelimit_sidecar.service.validation import Bounds


def server_tls_files(settings: Settings) -> TlsFiles | None:
    """The gRPC port's TLS files, None without `--grpc-tls-cert` (plaintext)."""
    if not settings.grpc_tls_cert or not settings.grpc_tls_key:
        return None
    ca, san = settings.grpc_tls_client_ca, settings.grpc_tls_client_san
    cert, key = Path(settings.grpc_tls_cert), Path(settings.grpc_tls_key)
    return TlsFiles(cert, key, client_ca=Path(ca) if ca else None, client_san=san or None)


def max_connection_age(settings: Settings) -> tuple[float, float] | None:
    """`build_server`'s `max_age`: a connection's age, then its calls' grace; None: no limit."""
    age = settings.grpc_max_connection_age_s
    return None if age is None else (age, settings.grpc_max_connection_age_grace_s)


def port_options(settings: Settings) -> PortOptions:
    """The gRPC port's bounds. Its largest message follows from the request bounds (RLQS
    reports are held to the same size)."""
    limits = replace(
        PORT_DEFAULTS.limits,
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
        max_message_bytes=request_bounds(settings).max_request_bytes(),
        unary_receive_timeout_s=settings.grpc_receive_timeout_s,
        stream_idle_timeout_s=settings.grpc_stream_idle_timeout_s,
    )
    return PortOptions(
        limits=limits,
        pending_bytes=settings.grpc_pending_bytes,
        max_connections=settings.grpc_max_connections,
        max_connections_per_peer=settings.grpc_max_connections_per_peer,
        tls_handshake_timeout_s=settings.grpc_tls_handshake_timeout_s,
        max_age=max_connection_age(settings),
    )


def tracing_options(settings: Settings) -> TracingOptions:
    """What the spans say and where they go (used only with `--tracing`)."""
    return TracingOptions(
        service_name=settings.tracing_service_name,
        service_namespace=settings.tracing_service_namespace,
        sampling_ratio=settings.tracing_sampling_ratio,
        endpoint=settings.tracing_endpoint,
        protocol=settings.tracing_protocol,
    )


def request_bounds(settings: Settings) -> Bounds:
    """What one request may hold: ShouldRateLimit and RLQS reports alike."""
    return Bounds(settings.max_descriptors, settings.max_entries, settings.max_value_bytes)


def response_options(settings: Settings) -> ResponseOptions:
    """What an answer carries besides the statuses. Shadow and quota mode settle the overall
    code (service/overall.py), after the limiter has decided and counted as usual."""
    return ResponseOptions(
        settings.ietf_headers,
        shadow_mode=settings.shadow_mode,
        quota_mode=settings.quota_mode,
        dynamic_metadata=settings.response_dynamic_metadata,
        reference_headers=reference_header_names(settings),
    )


def reference_header_names(settings: Settings) -> tuple[str, str, str] | None:
    """The reference's limit, remaining and reset header names; None: not sent."""
    if not settings.limit_response_headers:
        return None
    limit, remaining, reset = (n.strip() for n in settings.limit_response_header_names.split(","))
    return limit, remaining, reset


def quota_policy(settings: Settings) -> QuotaPolicy:
    return QuotaPolicy(shadow_mode=settings.shadow_mode)


def override_options(settings: Settings) -> OverrideOptions:
    """The state directory counts only local-only: with Redis, overrides live there."""
    state_dir = settings.state_dir if settings.local_only else None
    return OverrideOptions(override_bounds(settings), settings.overrides_refresh_s, state_dir)


def override_bounds(settings: Settings) -> OverrideBounds:
    """Overrides fit the request bounds and take the rule files' defaults."""
    return OverrideBounds(settings.max_entries, settings.max_value_bytes, settings.rule_defaults)


def admin_options(settings: Settings) -> AdminOptions:
    return AdminOptions(settings.admin_address, settings.admin_token_file)


def rule_loading(settings: Settings) -> RuleLoading:
    """How rule sets load, from files or xDS alike."""
    return RuleLoading(ConfigLimits.of(settings), settings.rule_defaults, settings.reload_poll_s)


def xds_options(settings: Settings) -> XdsOptions:
    """The control plane of `--config-xds` (used only when it is set)."""
    return XdsOptions(
        url=settings.xds_url or "",
        node_id=settings.config_xds_node_id,
        node_metadata=settings.config_xds_node_metadata,
        tls=xds_tls_files(settings),
        retry_s=settings.config_xds_retry_s,
        retry_max_s=settings.config_xds_retry_max_s,
        ready_without_config=settings.ready_without_config,
    )


def xds_tls_files(settings: Settings) -> XdsTlsFiles | None:
    """The files of `--config-xds-client-tls`, None without it (plaintext); each file left
    unset falls back to gRPC's default."""
    if not settings.config_xds_client_tls:
        return None
    return XdsTlsFiles(
        _path(settings.config_xds_client_tls_cert),
        _path(settings.config_xds_client_tls_key),
        _path(settings.config_xds_server_tls_cacert),
        settings.config_xds_server_tls_san or None,
    )


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None
