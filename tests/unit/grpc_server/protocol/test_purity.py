"""The protocol core is sans-IO: it imports no I/O, no clock, no event loop, no grpc and no
logging, and nothing of the sidecar outside its own package; time comes in as a parameter."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.imports import import_graph
from ratelimit_sidecar.grpc_server import protocol
from ratelimit_sidecar.grpc_server.protocol.limits import COUNTER_NAMES, Counters, Limits

ALLOWED = {
    "__future__", "collections", "collections.abc", "dataclasses", "enum", "heapq", "hpack",
    "struct", "typing", "urllib.parse",
}  # fmt: skip


def test_the_core_imports_only_pure_modules_and_itself() -> None:
    package = Path(protocol.__file__).parent
    graph = import_graph(package)
    imported = {name for names in graph.values() for name in names}
    outside = {name for name in imported if not name.startswith(protocol.__name__)}
    assert outside <= ALLOWED, outside - ALLOWED


def test_every_counter_is_exported() -> None:
    counters = Counters()
    counters.control_floods += 2
    exported = counters.as_dict()
    assert list(exported) == list(COUNTER_NAMES) and exported["control_floods"] == 2


def test_every_limit_has_a_default() -> None:
    limits = Limits()
    assert limits.max_concurrent_streams == 1024 and limits.unary_receive_timeout_s == 10.0
    assert limits.preface().startswith(b"\0\0\x12\x04\0\0\0\0\0")  # SETTINGS of 3 entries


@pytest.mark.parametrize(
    "changes",
    [
        {"max_frame_bytes": 1000},
        {"stream_window": 2**31},
        {"connection_window": 0},
        {"max_header_list_bytes": 100_000},
        {"frames_per_turn": 0},
    ],
)
def test_limits_that_http2_cannot_advertise_are_refused(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(changes)).split("_")[0]):
        Limits(**changes)
