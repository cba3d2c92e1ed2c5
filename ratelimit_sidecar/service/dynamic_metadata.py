"""The response's `dynamic_metadata` (--response-dynamic-metadata), as the reference fills it.

domain       the request's domain
descriptors  per descriptor: `entries` ("key=value"), its own `limit` (text format),
             `hitsAddend` when set
hitsAddend   the request's hits_addend, when not 0
metadata     the `metadata` of every descriptor that passed, merged in request order (a
             key set keeps its value; mappings merge the same way)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf import text_format
from google.protobuf.struct_pb2 import Struct

from ratelimit_sidecar._proto.wire import RateLimitDescriptor, RateLimitRequest
from ratelimit_sidecar.core import Code, Hit, Verdict
from ratelimit_sidecar.service.response import varint

_DYNAMIC_METADATA = b"\x32"  # RateLimitResponse.dynamic_metadata = 6, length-delimited


def dynamic_metadata_field(
    request: RateLimitRequest, hits: Sequence[Hit], verdicts: Sequence[Verdict]
) -> bytes:
    """Appended to an encoded RateLimitResponse."""
    fields: dict[str, object] = {
        "domain": request.domain,
        "descriptors": [_descriptor(d) for d in request.descriptors],
    }
    if request.hits_addend:
        fields["hitsAddend"] = request.hits_addend
    passed: dict[str, object] = {}
    for hit, verdict in zip(hits, verdicts, strict=True):
        rule = hit.rule
        if rule is None or rule.limit is None or rule.metadata is None:
            continue
        if verdict.code is not Code.OVER_LIMIT:
            _merge(passed, rule.metadata)
    if passed:
        fields["metadata"] = passed
    struct = Struct()
    struct.update(fields)  # type: ignore[arg-type]  # JSON-like values, as Struct takes them
    payload = struct.SerializeToString()
    return _DYNAMIC_METADATA + varint(len(payload)) + payload


def _descriptor(descriptor: RateLimitDescriptor) -> dict[str, object]:
    found: dict[str, object] = {"entries": [f"{e.key}={e.value}" for e in descriptor.entries]}
    if descriptor.HasField("limit"):
        found["limit"] = text_format.MessageToString(descriptor.limit, as_one_line=True)
    if descriptor.HasField("hits_addend"):
        found["hitsAddend"] = descriptor.hits_addend.value
    return found


def _merge(into: dict[str, object], source: Mapping[str, object]) -> None:
    for key, value in source.items():
        present = into.get(key)
        if key not in into:
            into[key] = _copy(value)
        elif isinstance(present, dict) and isinstance(value, Mapping):
            _merge(present, value)


def _copy(value: object) -> object:
    """So that merging never changes a rule's own metadata."""
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    return value
