"""The one settings object of a sidecar process, and the only place its defaults live.

Every field is an option: its command line flag is the field name with dashes (`--max-keys`),
its environment variable is `RLS_` + the upper-case name (`RLS_MAX_KEYS`), and its help text is
the field's `help` metadata (app/option_fields.py; app/flags.py derives them).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from ratelimit_sidecar.app.option_fields import described, option
from ratelimit_sidecar.config.limits import DEFAULT_LIMITS
from ratelimit_sidecar.config.model import (
    NEAR_LIMIT_RATIO,
    AlgorithmName,
    Consistency,
    RuleDefaults,
)
from ratelimit_sidecar.core import DEFAULT_MAX_KEYS
from ratelimit_sidecar.core.quiet_keys import QUIET_SHARE
from ratelimit_sidecar.core.schedule import DEFAULT_TIMEOUT_MS
from ratelimit_sidecar.grpc_server.transport.options import PORT_DEFAULTS
from ratelimit_sidecar.service.validation import DEFAULT_BOUNDS

CONSISTENCY_CHOICES = tuple(choice.value for choice in Consistency)

ENV_PREFIX = "RLS_"
DEFAULT_ADMIN_ADDRESS = "127.0.0.1:9091"
REUSE_PORT_ENV = ENV_PREFIX + "REUSE_PORT"  # set by the --workers supervisor for its children
TRANSPORTS = ("fast", "grpcio")


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Settings:
    config_path: str = field(
        default="",
        metadata=described(
            "rule YAML file or directory (envoyproxy/ratelimit format); not with --config-xds",
            flag="config",
        ),
    )
    redis_url: str | None = field(
        default=None,
        metadata=described("redis:// rediss:// unix:// URL; omit for a single local node"),
    )
    grpc_address: str = field(
        default="127.0.0.1:8081", metadata=described("host:port for ShouldRateLimit")
    )
    metrics_address: str = field(
        default="127.0.0.1:9090", metadata=described("host:port for /metrics, /healthz, /readyz")
    )
    node_id: str = field(
        default_factory=default_node_id,
        metadata=described("this node's id", default_text="hostname-pid"),
    )
    transport: str = field(
        default="fast",
        metadata=described("gRPC server: fast (HTTP/2 on the sidecar's loop) or grpcio"),
    )
    workers: int = field(
        default=1, metadata=described("processes sharing the gRPC port (SO_REUSEPORT)")
    )
    shadow_mode: bool = field(
        default=False,
        metadata=described("count and report, answer OK overall (statuses stay OVER_LIMIT)"),
    )
    quota_mode: bool = field(
        default=False,
        metadata=described("every descriptor in quota mode: refuse only if all of them are over"),
    )
    response_dynamic_metadata: bool = field(
        default=False,
        metadata=described("add the request and its passing descriptors' metadata to each answer"),
    )
    grpc_tls_cert: str | None = field(
        default=None, metadata=described("PEM certificate chain: serve the gRPC port over TLS")
    )
    grpc_tls_key: str | None = field(default=None, metadata=described("PEM key of --grpc-tls-cert"))
    grpc_tls_client_ca: str | None = field(
        default=None,
        metadata=described("PEM CA that client certificates must chain to (mTLS: then required)"),
    )
    grpc_tls_client_san: str | None = field(
        default=None,
        metadata=described("a subject alternative name client certificates must carry"),
    )
    tracing: bool = option(False, "export OpenTelemetry traces (ShouldRateLimit and syncs)")
    tracing_endpoint: str | None = option(
        None, "OTLP endpoint URL (else OTEL_EXPORTER_OTLP_ENDPOINT or the SDK default)"
    )
    tracing_protocol: str = option("grpc", "OTLP over grpc or http")
    tracing_service_name: str = option("ratelimit-sidecar", "service.name of the spans")
    tracing_service_namespace: str | None = option(None, "service.namespace of the spans")
    tracing_sampling_ratio: float = option(1.0, "share of new traces sampled (Envoy's is kept)")
    grpc_max_connection_age_s: float | None = option(
        None, "seconds a gRPC connection lives before GOAWAY (clients re-resolve); off"
    )
    grpc_max_connection_age_grace_s: float = option(60.0, "seconds an aged connection's calls get")
    grpc_max_concurrent_streams: int = option(
        PORT_DEFAULTS.limits.max_concurrent_streams, "calls one gRPC connection may have open"
    )
    grpc_pending_bytes: int = option(
        PORT_DEFAULTS.pending_bytes, "request bytes the gRPC port holds unfinished, all connections"
    )
    grpc_receive_timeout_s: float = option(
        PORT_DEFAULTS.limits.unary_receive_timeout_s,
        "seconds a unary call's request may take to arrive whole",
    )
    grpc_stream_idle_timeout_s: float = option(
        PORT_DEFAULTS.limits.stream_idle_timeout_s,
        "seconds an RLQS stream may go without a report before it is ended",
    )
    grpc_max_connections: int = field(
        default=0,
        metadata=described(
            "gRPC connections kept; at the cap the quietest idle one makes room",
            default_text="the descriptor limit - 128",
        ),
    )
    grpc_max_connections_per_peer: int = option(
        PORT_DEFAULTS.max_connections_per_peer, "gRPC connections kept from one client address"
    )
    grpc_tls_handshake_timeout_s: float = option(
        PORT_DEFAULTS.tls_handshake_timeout_s, "seconds a TLS handshake on the gRPC port may take"
    )
    limit_response_headers: bool = option(
        False, "add the reference's RateLimit-Limit/-Remaining/-Reset to every answer"
    )
    limit_response_header_names: str = option(
        "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", "those headers' names, in order"
    )
    near_limit_ratio: float = option(
        NEAR_LIMIT_RATIO, "share of a limit used from which an OK answer counts as near_limit"
    )
    health_address: str | None = option(
        None, "host:port of a listener of its own for /healthcheck, /healthz, /readyz"
    )
    debug_address: str | None = option(
        None, "host:port of /rlconfig and POST /json (the reference's debug port); off"
    )
    log_format: str = field(default="text", metadata=described("text or json"))
    log_level: str = field(default="info", metadata=described("debug, info, warning or error"))
    ietf_headers: bool = field(
        default=False, metadata=described("add RateLimit-Policy / RateLimit response headers")
    )
    debug_show_values: bool = field(
        default=False,
        metadata=described("/debug/keys shows raw descriptor values (API keys?), not digests"),
    )
    max_keys: int = field(default=DEFAULT_MAX_KEYS, metadata=described("bound on tracked keys"))
    max_descriptors: int = field(
        default=DEFAULT_BOUNDS.max_descriptors,
        metadata=described("descriptors allowed per request"),
    )
    max_entries: int = field(
        default=DEFAULT_BOUNDS.max_entries, metadata=described("entries allowed per descriptor")
    )
    max_value_bytes: int = field(
        default=DEFAULT_BOUNDS.max_bytes,
        metadata=described("bytes allowed per descriptor key or value"),
    )
    redis_prefix: str = field(default="rls:", metadata=described("prefix of every Redis key"))
    quiet_share: float = option(QUIET_SHARE, "hold a key's hits while hits x nodes < this x MAX")
    new_keys_even_split: bool = option(False, "a new key assumes an even split, not one gateway")
    sync_timeout_ms: int = field(
        default=DEFAULT_TIMEOUT_MS,
        metadata=described("Redis timeout per sync, more for a large sync (at most half a span)"),
    )
    shutdown_grace_s: float = field(
        default=5.0, metadata=described("seconds in-flight requests get to finish on shutdown")
    )
    reload_poll_s: float = field(
        default=0.5, metadata=described("seconds between checks of the rule files for changes")
    )
    max_rule_file_bytes: int = field(
        default=DEFAULT_LIMITS.max_rule_file_bytes,
        metadata=described("bytes allowed per rule file, checked before reading it"),
    )
    max_rule_dir_bytes: int = field(
        default=DEFAULT_LIMITS.max_rule_dir_bytes,
        metadata=described("bytes allowed for all the rule files of the config directory"),
    )
    max_rule_descriptors: int = field(
        default=DEFAULT_LIMITS.max_rule_descriptors,
        metadata=described("descriptors allowed in the whole rule set"),
    )
    max_yaml_nodes: int = field(
        default=DEFAULT_LIMITS.max_yaml_nodes,
        metadata=described(
            "YAML nodes allowed per rule file, each alias counting as what it repeats"
        ),
    )

    default_algorithm: str = field(
        default="fixed_window",
        metadata=described(
            "algorithm of rules that name none: fixed_window, sliding_window, token_bucket"
            " or sliding_log"
        ),
    )
    default_consistency: str = field(
        default="edge",
        metadata=described(
            "consistency of limits that name none: edge (synced fast near their limit; a"
            " sliding_log is never shared without strict), eventual or strict"
        ),
    )
    strict_timeout_ms: int = field(
        default=50,
        metadata=described(
            "Redis timeout of one strict check (keep it under Envoy's filter timeout)"
        ),
    )
    # Runtime overrides (docs/OVERRIDES.md). The admin token is never a setting: it comes from
    # a file or from RLS_ADMIN_TOKEN (http_server/admin_token.py), so that it shows in no
    # command line, log or repr.
    admin_address: str = field(
        default=DEFAULT_ADMIN_ADDRESS,
        metadata=described("host:port of the overrides admin API (opened only with a token)"),
    )
    admin_token_file: str | None = field(
        default=None, metadata=described("file holding the admin API's bearer token")
    )
    state_dir: str | None = field(
        default=None, metadata=described("directory keeping runtime overrides without Redis")
    )
    overrides_refresh_s: float = field(
        default=10.0, metadata=described("seconds between full reads of the override set")
    )

    # Rules from an xDS control plane instead of files (docs/XDS.md); the `ratelimit` command
    # maps the reference's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_* variables here.
    config_xds: str | None = option(
        None, "host:port of an xDS control plane serving RateLimitConfig (ADS); replaces --config"
    )
    config_xds_node_id: str = option("default", "node id sent to the control plane")
    config_xds_node_metadata: str = option("", "node metadata for the control plane: k=v,k=v")
    config_xds_client_tls: bool = option(False, "TLS to the control plane")
    config_xds_client_tls_cert: str | None = option(
        None, "client certificate (PEM) for mTLS to the control plane, re-read on change"
    )
    config_xds_client_tls_key: str | None = option(None, "its private key (PEM)")
    config_xds_server_tls_cacert: str | None = option(
        None, "CA (PEM) the control plane's certificate must chain to (else the system's)"
    )
    config_xds_server_tls_san: str | None = option(
        None, "name the control plane's certificate must carry (else the URL's host)"
    )
    config_xds_retry_s: float = option(
        3.0, "first reconnect delay after a stream error; doubles per failed attempt, jittered"
    )
    config_xds_retry_max_s: float = option(60.0, "longest reconnect delay")
    ready_without_config: bool = option(
        False, "with xDS rules, /readyz answers ready before the first configuration arrives"
    )

    def __post_init__(self) -> None:
        self._check_rule_source()
        self._check_grpc_port()
        self._check_serving()
        self._check_tracing()
        self._check_tls()

    def _check_serving(self) -> None:
        if AlgorithmName.parse(self.default_algorithm) is None:
            names = ", ".join(name.text for name in AlgorithmName)
            raise ValueError(f"--default-algorithm must be one of {names}")
        if self.default_consistency not in CONSISTENCY_CHOICES:
            names = ", ".join(CONSISTENCY_CHOICES)
            raise ValueError(f"--default-consistency must be one of {names}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--transport must be one of {', '.join(TRANSPORTS)}")
        if self.overrides_refresh_s <= 0:
            raise ValueError("--overrides-refresh-s must be a positive number of seconds")
        if self.strict_timeout_ms <= 0:
            raise ValueError("--strict-timeout-ms must be a positive number of milliseconds")
        if len(self.limit_response_header_names.split(",")) != 3:
            raise ValueError(
                "--limit-response-header-names takes three names: limit,remaining,reset"
            )
        if not 0.0 < self.near_limit_ratio <= 1.0:
            raise ValueError("--near-limit-ratio must be above 0 and at most 1")

    def _check_tracing(self) -> None:
        if self.tracing_protocol not in ("grpc", "http"):
            raise ValueError("--tracing-protocol must be grpc or http")
        if not 0.0 <= self.tracing_sampling_ratio <= 1.0:
            raise ValueError("--tracing-sampling-ratio must be between 0 and 1")

    def _check_tls(self) -> None:
        if bool(self.grpc_tls_cert) != bool(self.grpc_tls_key):
            raise ValueError("--grpc-tls-cert and --grpc-tls-key go together")
        if self.grpc_tls_client_ca and not self.grpc_tls_cert:
            raise ValueError("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
        if self.grpc_tls_client_san and not self.grpc_tls_client_ca:
            raise ValueError("--grpc-tls-client-san needs --grpc-tls-client-ca")

    def _check_grpc_port(self) -> None:
        positive = {
            "--grpc-max-concurrent-streams": self.grpc_max_concurrent_streams,
            "--grpc-pending-bytes": self.grpc_pending_bytes,
            "--grpc-receive-timeout-s": self.grpc_receive_timeout_s,
            "--grpc-stream-idle-timeout-s": self.grpc_stream_idle_timeout_s,
            "--grpc-max-connections-per-peer": self.grpc_max_connections_per_peer,
            "--grpc-tls-handshake-timeout-s": self.grpc_tls_handshake_timeout_s,
        }
        for flag, value in positive.items():
            if value <= 0:
                raise ValueError(f"{flag} must be positive")
        if self.grpc_max_connections < 0:
            raise ValueError("--grpc-max-connections must be positive (0: the default)")

    def _check_rule_source(self) -> None:
        if self.xds_url is None and not self.config_path:
            raise ValueError("--config (or RLS_CONFIG) is required, unless --config-xds is set")
        if bool(self.config_xds_client_tls_cert) != bool(self.config_xds_client_tls_key):
            raise ValueError("--config-xds-client-tls-cert and -key go together")
        if not 0 < self.config_xds_retry_s <= self.config_xds_retry_max_s:
            raise ValueError("--config-xds-retry-s must be > 0 and <= --config-xds-retry-max-s")

    @property
    def xds_url(self) -> str | None:
        """The control plane rules come from, or None when they come from files."""
        return self.config_xds or None

    @property
    def local_only(self) -> bool:
        return not self.redis_url

    @property
    def rule_defaults(self) -> RuleDefaults:
        """What rule files leave unsaid, from these settings."""
        algorithm = AlgorithmName.parse(self.default_algorithm) or AlgorithmName.FIXED_WINDOW
        return RuleDefaults(
            algorithm=algorithm,
            consistency=Consistency(self.default_consistency),
            shared_store=not self.local_only,
            near_limit_ratio=self.near_limit_ratio,
        )
