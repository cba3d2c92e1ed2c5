"""Short names for the generated Envoy rate limit service stubs.

Import protocol types from here rather than from the generated ``envoy`` tree beside it.
"""

from __future__ import annotations

from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor

from ratelimit_sidecar._proto.envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from ratelimit_sidecar._proto.envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import (
    RateLimitDescriptor,
)
from ratelimit_sidecar._proto.envoy.service.ratelimit.v3 import rls_pb2
from ratelimit_sidecar._proto.envoy.service.ratelimit.v3.rls_pb2 import (
    RateLimitRequest,
    RateLimitResponse,
)
from ratelimit_sidecar._proto.envoy.service.ratelimit.v3.rls_pb2_grpc import (
    RateLimitServiceServicer,
    RateLimitServiceStub,
    add_RateLimitServiceServicer_to_server,
)
from ratelimit_sidecar._proto.envoy.type.v3.ratelimit_unit_pb2 import RateLimitUnit

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD_PATH = f"/{SERVICE_NAME}/ShouldRateLimit"

# For grpc_reflection: the file descriptor (with its dependencies) and the service.
RLS_FILE_DESCRIPTOR: FileDescriptor = rls_pb2.DESCRIPTOR
SERVICE_DESCRIPTOR: ServiceDescriptor = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]

Entry = RateLimitDescriptor.Entry
RateLimitOverride = RateLimitDescriptor.RateLimitOverride
Code = RateLimitResponse.Code
DescriptorStatus = RateLimitResponse.DescriptorStatus
RateLimit = RateLimitResponse.RateLimit
Unit = RateLimitResponse.RateLimit.Unit
Quota = RateLimitResponse.Quota

__all__ = [
    "METHOD_PATH",
    "RLS_FILE_DESCRIPTOR",
    "SERVICE_DESCRIPTOR",
    "SERVICE_NAME",
    "Code",
    "DescriptorStatus",
    "Entry",
    "HeaderValue",
    "HeaderValueOption",
    "Quota",
    "RateLimit",
    "RateLimitDescriptor",
    "RateLimitOverride",
    "RateLimitRequest",
    "RateLimitResponse",
    "RateLimitServiceServicer",
    "RateLimitServiceStub",
    "RateLimitUnit",
    "Unit",
    "add_RateLimitServiceServicer_to_server",
]
