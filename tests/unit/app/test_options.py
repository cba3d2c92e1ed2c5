"""The settings turned into each component's options (app/options.py): every flag still reaches
its component, and the components below app/ see their options only."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from ratelimit_sidecar.app import options
from ratelimit_sidecar.app.flags import OPTIONS
from ratelimit_sidecar.app.settings import ENV_PREFIX, Settings
from ratelimit_sidecar.config.limits import LIMIT_NAMES
from ratelimit_sidecar.grpc_server.tls import TlsFiles
from ratelimit_sidecar.grpc_server.tracing import TracingOptions
from ratelimit_sidecar.http_server.admin import AdminOptions
from ratelimit_sidecar.http_server.admin_token import ADMIN_TOKEN_ENV

APP_DIR = Path(options.__file__).parent
# Read through a property of Settings rather than by name.
READ_THROUGH = {
    "config_xds": "xds_url",
    "default_algorithm": "rule_defaults",
    "default_consistency": "rule_defaults",
    "near_limit_ratio": "rule_defaults",
}


def readers_source() -> str:
    """app/ and cli/, but not settings.py: its checks read every field."""
    paths = [*APP_DIR.glob("*.py"), *(APP_DIR.parent / "cli").glob("*.py")]
    return "\n".join(path.read_text() for path in paths if path.name != "settings.py")


def test_every_setting_is_read_by_app_or_cli() -> None:
    """A flag the refactoring dropped would be accepted and do nothing: each field is read by
    name in app/ or cli/ (the rule file limits by `ConfigLimits.of`)."""
    source = readers_source()
    unread = [
        spec.name
        for spec in fields(Settings)
        if spec.name not in LIMIT_NAMES
        and not re.search(rf"\.{READ_THROUGH.get(spec.name, spec.name)}\b", source)
    ]
    assert unread == []


def test_the_admin_token_variable_has_the_prefix_and_is_no_option() -> None:
    assert ADMIN_TOKEN_ENV.removeprefix(ENV_PREFIX) == "ADMIN_TOKEN"
    assert ADMIN_TOKEN_ENV not in {option.env for option in OPTIONS}


def test_server_tls_files_only_with_a_certificate() -> None:
    assert options.server_tls_files(Settings(config_path="r")) is None
    settings = Settings(
        config_path="r",
        grpc_tls_cert="c.pem",
        grpc_tls_key="k.pem",
        grpc_tls_client_ca="ca.pem",
        grpc_tls_client_san="envoy",
    )
    expected = TlsFiles(Path("c.pem"), Path("k.pem"), Path("ca.pem"), "envoy")
    assert options.server_tls_files(settings) == expected


def test_the_state_directory_keeps_overrides_only_without_redis() -> None:
    local = Settings(config_path="r", state_dir="/state", overrides_refresh_s=3.0)
    shared = Settings(config_path="r", state_dir="/state", redis_url="redis://h:6379")
    assert options.override_options(local).state_dir == "/state"
    assert options.override_options(local).refresh_s == 3.0
    assert options.override_options(shared).state_dir is None


def test_reference_headers_are_named_only_when_on() -> None:
    names = "X-Limit, X-Remaining ,X-Reset"
    off = Settings(config_path="r", limit_response_header_names=names)
    on = Settings(config_path="r", limit_response_headers=True, limit_response_header_names=names)
    assert options.response_options(off).reference_headers is None
    assert options.response_options(on).reference_headers == ("X-Limit", "X-Remaining", "X-Reset")


def test_tracing_admin_and_connection_age_options() -> None:
    settings = Settings(
        config_path="r",
        tracing_service_namespace="edge",
        tracing_endpoint="http://otel:4318",
        tracing_protocol="http",
        admin_address="127.0.0.1:0",
        grpc_max_connection_age_s=300.0,
    )
    assert options.tracing_options(settings) == TracingOptions(
        "ratelimit-sidecar", "edge", 1.0, "http://otel:4318", "http"
    )
    assert options.admin_options(settings) == AdminOptions("127.0.0.1:0", None)
    assert options.max_connection_age(settings) == (300.0, 60.0)
    assert options.max_connection_age(Settings(config_path="r")) is None


def test_xds_options_carry_the_control_plane_settings() -> None:
    settings = Settings(
        config_xds="xds:18000",
        config_xds_node_id="edge",
        config_xds_retry_s=1.0,
        config_xds_retry_max_s=8.0,
        ready_without_config=True,
    )
    xds = options.xds_options(settings)
    assert (xds.url, xds.node_id, xds.tls) == ("xds:18000", "edge", None)
    assert (xds.retry_s, xds.retry_max_s, xds.ready_without_config) == (1.0, 8.0, True)
    loading = options.rule_loading(settings)
    assert loading.defaults == settings.rule_defaults
    assert loading.poll_s == settings.reload_poll_s
