"""The Envoy bootstraps of `bench rlqs`: one route to a stand-in backend, without a rate limit
filter, with `rate_limit_quota` (RLQS), or with `ratelimit` (RLS).

The backend is a second listener of the same Envoy answering 200, so the filter is the only
difference. The RLQS filter follows what Envoy 1.40 accepts: one bucket per API key, `{api_key:
<x-api-key>}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.envoy import EnvoyProcess, Wrap, envoy_binary
from harness.net import free_port
from harness.process import launch

PLAIN, RLQS, RLS = "plain", "rlqs", "rls"
SERVICE_CLUSTER = "limiter"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
RLQS_CONFIG = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3."
RLS_CONFIG = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _cluster(name: str, port: int, http2: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(port)}}]}],
        },
    }
    if http2:
        options = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": options,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _listener(name: str, port: int, route: dict[str, Any], filters: list[Any]) -> dict[str, Any]:
    manager = {
        "@type": HCM + "HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [*filters, ROUTER],
    }
    return {
        "name": name,
        "address": _address(port),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def rlqs_filter(domain: str) -> dict[str, Any]:
    """One bucket per x-api-key value; no assignment yet (or expired): allow."""
    settings = {
        "@type": RLQS_CONFIG + "RateLimitQuotaBucketSettings",
        "bucket_id_builder": {
            "bucket_id_builder": {
                "api_key": {
                    "custom_value": {
                        "name": "api_key",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.type.matcher.v3."
                            "HttpRequestHeaderMatchInput",
                            "header_name": "x-api-key",
                        },
                    }
                }
            }
        },
        "reporting_interval": "5s",  # what 1.40 does whatever this says
        "deny_response_settings": {"http_status": {"code": 429}},
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
    }
    config = {
        "@type": RLQS_CONFIG + "RateLimitQuotaFilterConfig",
        "rlqs_server": {"envoy_grpc": {"cluster_name": SERVICE_CLUSTER}},
        "domain": domain,
        "bucket_matchers": {
            "on_no_match": {"action": {"name": "by_api_key", "typed_config": settings}}
        },
    }
    return {"name": "envoy.filters.http.rate_limit_quota", "typed_config": config}


def rls_filter(domain: str) -> dict[str, Any]:
    config = {
        "@type": RLS_CONFIG,
        "domain": domain,
        # The bench measures cost, not timeouts: on a core shared by four stacks a 50 ms
        # timeout (the demo's) lets a few calls fail open, which would save the sidecar work.
        "timeout": "1s",
        "failure_mode_deny": False,
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": SERVICE_CLUSTER}},
        },
    }
    return {"name": "envoy.filters.http.ratelimit", "typed_config": config}


def bootstrap(kind: str, ports: dict[str, int], domain: str) -> dict[str, Any]:
    """`ports`: listen, admin, backend, and (with a filter) service."""
    route: dict[str, Any] = {"match": {"prefix": "/"}, "route": {"cluster": "backend"}}
    filters: list[Any] = []
    clusters = [_cluster("backend", ports["backend"], http2=False)]
    if kind == RLS:
        route["route"]["rate_limits"] = [
            {
                "actions": [
                    {"request_headers": {"header_name": "x-api-key", "descriptor_key": "api_key"}}
                ]
            }
        ]
        filters = [rls_filter(domain)]
    elif kind == RLQS:
        filters = [rlqs_filter(domain)]
    elif kind != PLAIN:
        raise ValueError(f"unknown Envoy kind {kind!r}")
    if filters:
        clusters.append(_cluster(SERVICE_CLUSTER, ports["service"], http2=True))
    answer = {
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}},
    }
    return {
        "admin": {"address": _address(ports["admin"])},
        "static_resources": {
            "listeners": [
                _listener("gateway", ports["listen"], route, filters),
                _listener("backend", ports["backend"], answer, []),
            ],
            "clusters": clusters,
        },
    }


class BenchEnvoy(EnvoyProcess):
    """An Envoy (`--concurrency 1`) running one of this module's bootstraps."""

    def __init__(  # noqa: PLR0917 - each value named at the one call site
        self, workdir: Path, name: str, kind: str, service_port: int, domain: str, wrap: Wrap
    ) -> None:
        self.port, self.admin_port = free_port(), free_port()
        ports = {"listen": self.port, "admin": self.admin_port, "backend": free_port()}
        ports["service"] = service_port
        self.config = workdir / f"{name}.json"
        self.config.write_text(json.dumps(bootstrap(kind, ports, domain), indent=1))
        self.log = workdir / f"{name}.log"
        argv = [str(envoy_binary()), "-c", str(self.config), "--concurrency", "1"]
        argv += ["--disable-hot-restart", "--log-level", "warn"]
        self.proc = launch(wrap(argv), self.log)
        self.url = f"http://127.0.0.1:{self.port}"
