"""Traces of a real sidecar at a real OTLP receiver: the parent Envoy sent, both protocols."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.otlp import OtlpReceiver
from harness.redis_servers import ServerProcess
from harness.rules import write_rules
from harness.sidecar import SidecarProcess

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # ms between the batch processor's exports


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


def traced_sidecar(
    tmp_path: Path, endpoint: str, protocol: str, *more: str, transport: str | None = None
) -> SidecarProcess:
    args = ["--tracing", "--tracing-endpoint", endpoint, "--tracing-protocol", protocol]
    rules = write_rules(tmp_path)
    return SidecarProcess(rules, *args, *more, env=FAST_EXPORT, transport=transport).wait_ready()


def call(sidecar: SidecarProcess, metadata: tuple[tuple[str, str], ...]) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        message = request("gateway", [("client", "traced")])
        rls_stub(channel).ShouldRateLimit(message, timeout=5, metadata=metadata)


@pytest.mark.parametrize(
    ("protocol", "transport"), [("grpc", "fast"), ("http", "fast"), ("grpc", "grpcio")]
)
def test_a_request_span_continues_the_w3c_trace_envoy_sent(
    tmp_path: Path, receiver: OtlpReceiver, protocol: str, transport: str
) -> None:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    sidecar = traced_sidecar(tmp_path, endpoint, protocol, transport=transport)
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    try:
        call(sidecar, (("traceparent", f"00-{trace_id}-{parent}-01"),))
        spans = receiver.wait_for("ShouldRateLimit")
    finally:
        sidecar.stop()
    assert [(s.trace_id, s.parent_span_id) for s in spans] == [(trace_id, parent)]
    assert spans[0].attributes["ratelimit.overall_code"] == "OK"
    assert f"({transport} transport;" in sidecar.stderr  # no fallback to grpcio


def test_b3_headers_are_continued_too(tmp_path: Path, receiver: OtlpReceiver) -> None:
    sidecar = traced_sidecar(tmp_path, receiver.grpc_endpoint, "grpc")
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    b3 = (("x-b3-traceid", trace_id), ("x-b3-spanid", parent), ("x-b3-sampled", "1"))
    try:
        call(sidecar, b3)
        spans = receiver.wait_for("ShouldRateLimit")
    finally:
        sidecar.stop()
    assert [(s.trace_id, s.parent_span_id) for s in spans] == [(trace_id, parent)]


def test_sampling_ratio_zero_keeps_only_traces_envoy_sampled(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    sidecar = traced_sidecar(
        tmp_path, receiver.grpc_endpoint, "grpc", "--tracing-sampling-ratio", "0"
    )
    sampled = secrets.token_hex(16)
    try:
        for _ in range(5):
            call(sidecar, ())  # new traces: ratio 0 samples none
        call(sidecar, (("traceparent", f"00-{sampled}-{secrets.token_hex(8)}-01"),))
        spans = receiver.wait_for("ShouldRateLimit")
    finally:
        sidecar.stop()  # flushes what is queued
    assert [s.trace_id for s in receiver.spans if s.name == "ShouldRateLimit"] == [sampled]
    assert len(spans) == 1


def test_syncs_are_traced(
    tmp_path: Path, receiver: OtlpReceiver, redis_server: ServerProcess
) -> None:
    sidecar = traced_sidecar(
        tmp_path, receiver.grpc_endpoint, "grpc", "--redis-url", redis_server.url,
        "--redis-prefix", "traced:",
    )  # fmt: skip
    try:
        call(sidecar, ())
        spans = receiver.wait_for("sync", lambda s: s.attributes["ratelimit.sync.pushed_hits"] > 0)
    finally:
        sidecar.stop()
    assert spans[0].attributes["ratelimit.sync.pushed_hits"] == 1
