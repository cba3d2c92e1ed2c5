"""Edits of the demo's Envoy bootstrap for tests: TLS to the sidecar, tracing to OTLP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.envoy import Tune

TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
OTEL_CONFIG = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig"


def cluster(bootstrap: dict[str, Any], name: str) -> dict[str, Any]:
    clusters = bootstrap["static_resources"]["clusters"]
    return next(c for c in clusters if c["name"] == name)


def sidecar_tls(ca: Path, server_name: str, client: tuple[Path, Path] | None = None) -> Tune:
    """The rate limit cluster over TLS, trusting `ca` for `server_name`; mTLS with `client`."""

    def tune(bootstrap: dict[str, Any]) -> None:
        context: dict[str, Any] = {
            "alpn_protocols": ["h2"],
            "validation_context": {
                "trusted_ca": {"filename": str(ca)},
                "match_typed_subject_alt_names": [
                    {"san_type": "DNS", "matcher": {"exact": server_name}}
                ],
            },
        }
        if client is not None:
            chain, key = client
            pair = {
                "certificate_chain": {"filename": str(chain)},
                "private_key": {"filename": str(key)},
            }
            context["tls_certificates"] = [pair]
        cluster(bootstrap, "ratelimit_sidecar")["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": TLS_CONTEXT,
                "sni": server_name,
                "common_tls_context": context,
            },
        }

    return tune


def otlp_tracing(otlp_port: int, service_name: str = "gateway") -> Tune:
    """Every request traced (OpenTelemetry, exported to an OTLP gRPC receiver on `otlp_port`):
    the rate limit filter's call then carries the trace context to the sidecar."""

    def tune(bootstrap: dict[str, Any]) -> None:
        listener = bootstrap["static_resources"]["listeners"][0]
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        manager["tracing"] = {
            "random_sampling": {"value": 100},
            "provider": {
                "name": "envoy.tracers.opentelemetry",
                "typed_config": {
                    "@type": OTEL_CONFIG,
                    "grpc_service": {"envoy_grpc": {"cluster_name": "otlp"}},
                    "service_name": service_name,
                },
            },
        }
        otlp = dict(cluster(bootstrap, "ratelimit_sidecar"))
        otlp.pop("transport_socket", None)
        address = {"socket_address": {"address": "127.0.0.1", "port_value": otlp_port}}
        otlp["name"] = "otlp"
        otlp["load_assignment"] = {
            "cluster_name": "otlp",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        }
        bootstrap["static_resources"]["clusters"].append(otlp)

    return tune
