"""The vendored xDS protos: `RateLimitConfig` as the reference service's API numbers it, the
discovery messages as Envoy's (checked against the Envoy binary in test_proto.py)."""

from __future__ import annotations

from google.protobuf.message import Message
from google.rpc import status_pb2

from ratelimit_sidecar._proto.envoy.config.core.v3 import base_pb2
from ratelimit_sidecar._proto.envoy.service.discovery.v3 import ads_pb2, discovery_pb2
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls
from ratelimit_sidecar.config.xds_rules import RESOURCE_TYPE
from tools import genproto

# From the reference's api/ratelimit/config/ratelimit/v3/rls_conf.proto and Envoy's API;
# test_proto.py checks them with its own.
XDS_NUMBERS: list[tuple[type[Message], str, int]] = [
    (rls.RateLimitConfig, "name", 1),
    (rls.RateLimitConfig, "domain", 2),
    (rls.RateLimitConfig, "descriptors", 3),
    (rls.RateLimitDescriptor, "key", 1),
    (rls.RateLimitDescriptor, "value", 2),
    (rls.RateLimitDescriptor, "rate_limit", 3),
    (rls.RateLimitDescriptor, "descriptors", 4),
    (rls.RateLimitDescriptor, "shadow_mode", 5),
    (rls.RateLimitDescriptor, "detailed_metric", 6),
    (rls.RateLimitDescriptor, "quota_mode", 7),
    (rls.RateLimitDescriptor, "metadata", 8),
    (rls.RateLimitPolicy, "unit", 1),
    (rls.RateLimitPolicy, "requests_per_unit", 2),
    (rls.RateLimitPolicy, "unlimited", 3),
    (rls.RateLimitPolicy, "name", 4),
    (rls.RateLimitPolicy, "replaces", 5),
    (rls.RateLimitReplace, "name", 1),
    (discovery_pb2.DiscoveryRequest, "version_info", 1),
    (discovery_pb2.DiscoveryRequest, "node", 2),
    (discovery_pb2.DiscoveryRequest, "resource_names", 3),
    (discovery_pb2.DiscoveryRequest, "type_url", 4),
    (discovery_pb2.DiscoveryRequest, "response_nonce", 5),
    (discovery_pb2.DiscoveryRequest, "error_detail", 6),
    (discovery_pb2.DiscoveryResponse, "version_info", 1),
    (discovery_pb2.DiscoveryResponse, "resources", 2),
    (discovery_pb2.DiscoveryResponse, "type_url", 4),
    (discovery_pb2.DiscoveryResponse, "nonce", 5),
    (base_pb2.Node, "id", 1),
    (base_pb2.Node, "metadata", 3),
    (status_pb2.Status, "code", 1),
    (status_pb2.Status, "message", 2),
]


def test_units_include_week_with_its_late_number() -> None:
    assert dict(rls.RateLimitUnit.items()) == {
        "UNKNOWN": 0,
        "SECOND": 1,
        "MINUTE": 2,
        "HOUR": 3,
        "DAY": 4,
        "WEEK": 7,
        "MONTH": 5,
        "YEAR": 6,
    }


def test_type_url_and_service_path() -> None:
    assert "type.googleapis.com/" + rls.RateLimitConfig.DESCRIPTOR.full_name == RESOURCE_TYPE
    assert rls.DESCRIPTOR.package == "ratelimit.config.ratelimit.v3"
    service = ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"]
    assert service.full_name == "envoy.service.discovery.v3.AggregatedDiscoveryService"
    method = service.methods_by_name["StreamAggregatedResources"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type is discovery_pb2.DiscoveryRequest.DESCRIPTOR
    detail = discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields_by_name["error_detail"]
    assert detail.message_type is status_pb2.Status.DESCRIPTOR


def test_rewrite_covers_the_vendored_packages_and_leaves_protobuf_alone() -> None:
    src = (
        "from ratelimit.config.ratelimit.v3 import rls_conf_pb2 as a\n"
        "from google.rpc import status_pb2 as b\n"
        "from google.protobuf import any_pb2 as c\n"
    )
    assert genproto.rewrite_imports(src) == (
        "from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as a\n"
        "from google.rpc import status_pb2 as b\n"
        "from google.protobuf import any_pb2 as c\n"
    )
