"""OpenTelemetry traces, off by default: one span per ShouldRateLimit and one per sync.

A ShouldRateLimit span continues the trace Envoy sends in the request's metadata (W3C
`traceparent`, or B3 when Envoy is set to it). Spans are exported by the SDK's batch processor
from its own thread over OTLP (gRPC or HTTP/protobuf), so the request path only records them.
With tracing off the SDK is not even imported, and the servicer is the untraced one.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from ratelimit_sidecar._proto.wire import RateLimitResponse
from ratelimit_sidecar.core import SyncStats
from ratelimit_sidecar.grpc_server.rls import RateLimitServicer
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

log = logging.getLogger("ratelimit_sidecar.tracing")

PROTOCOLS = ("grpc", "http")
_TRACE_NAMES = ("traceparent", "tracestate", "b3", "x-b3-traceid", "x-b3-spanid",
                "x-b3-parentspanid", "x-b3-sampled", "x-b3-flags")  # fmt: skip
_TRACE_HEADERS = frozenset((*_TRACE_NAMES, *(n.encode() for n in _TRACE_NAMES)))
_W3C_SAMPLED = frozenset(f"{flags:02x}" for flags in range(256) if flags & 1)
SERVICE_NAMESPACE_ATTRIBUTE = "service.namespace"
OVERALL_CODE_ATTRIBUTE = "ratelimit.overall_code"


@dataclass(frozen=True, slots=True)
class TracingOptions:
    """What the spans say of this service and where they go (`--tracing-*`)."""

    service_name: str
    service_namespace: str | None  # None or "": no service.namespace attribute
    sampling_ratio: float  # share of the traces Envoy has not decided on that are sampled
    endpoint: str | None  # the OTLP endpoint; None: the SDK's default and OTEL_* variables
    protocol: str  # one of PROTOCOLS


class Tracing:
    """The process's tracer: spans for requests (`request_span`) and syncs (`synced`)."""

    def __init__(self, options: TracingOptions) -> None:
        from opentelemetry.propagators.b3 import B3MultiFormat
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes = {"service.name": options.service_name}
        if options.service_namespace:
            attributes[SERVICE_NAMESPACE_ATTRIBUTE] = options.service_namespace
        # Whether to trace is decided before the SDK is asked (`_sampled`): an unsampled call
        # then costs a look at its headers, not a span. What reaches the SDK is sampled.
        sampler = ParentBased(ALWAYS_ON)
        self._ratio = options.sampling_ratio
        self.provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
        self.provider.add_span_processor(BatchSpanProcessor(_exporter(options)))
        self.tracer = self.provider.get_tracer("ratelimit_sidecar")
        self._propagator = CompositePropagator([TraceContextTextMapPropagator(), B3MultiFormat()])
        self._server_kind = SpanKind.SERVER

    def request_span(self, metadata: Iterable[tuple[str | bytes, Any]]) -> Any:
        """A started ShouldRateLimit span, child of the trace in `metadata` (grpc's, or the
        fast transport's decoded headers) if any; None when the call is not sampled."""
        carrier = {_text(k).lower(): _text(v) for k, v in metadata if k in _TRACE_HEADERS}
        if not self._sampled(carrier):
            return None
        parent = self._propagator.extract(carrier)
        return self.tracer.start_span("ShouldRateLimit", parent, kind=self._server_kind)

    def _sampled(self, carrier: dict[str, str]) -> bool:
        """Envoy's decision when it sent one (W3C flags, B3 sampled), else the ratio."""
        parent = carrier.get("traceparent")
        if parent is not None and len(parent) >= 2:
            return parent[-2:] in _W3C_SAMPLED
        decision = carrier.get("x-b3-sampled") or carrier.get("x-b3-flags")
        if decision is not None:
            return decision in ("1", "true", "d")
        if "b3" in carrier:
            return carrier["b3"].split("-")[2:3] != ["0"]
        return random.random() < self._ratio

    def synced(self, stats: SyncStats, seconds: float, error_kind: str) -> None:
        """The sync loop's report, as a span of the time the sync took."""
        if random.random() >= self._ratio:
            return
        end = time.time_ns()
        span = self.tracer.start_span("sync", start_time=end - int(seconds * 1e9))
        span.set_attribute("ratelimit.sync.pushed_keys", stats.pushed_keys)
        span.set_attribute("ratelimit.sync.pushed_hits", stats.pushed_hits)
        span.set_attribute("ratelimit.sync.blocked_keys", stats.blocked_keys)
        if error_kind:
            span.set_attribute("ratelimit.sync.error", error_kind)
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is still queued (bounded by the SDK's own timeout)."""
        self.provider.shutdown()


class TracedServicer(RateLimitServicer):
    """ShouldRateLimit inside a span continuing Envoy's trace (only with tracing on): on the
    fast transport through `answer_with_headers`, on grpcio through `ShouldRateLimit`."""

    def __init__(
        self,
        handler: RateLimitHandler,
        observe_seconds: Callable[[float], None] | None,
        tracing: Tracing,
    ) -> None:
        super().__init__(handler, observe_seconds)
        self._tracing = tracing
        self.answer_with_headers = self._traced_answer

    def _traced_answer(
        self, headers: list[tuple[bytes, bytes]], request: bytes
    ) -> bytes | Awaitable[bytes]:
        span = self._tracing.request_span(headers)
        try:
            response = self.answer(request)
        except BaseException:
            end_request_span(span, None, "error")
            raise
        if isinstance(response, bytes):
            end_request_span(span, response)
            return response
        return self._traced_finish(span, response)

    async def _traced_finish(self, span: Any, response: Awaitable[bytes]) -> bytes:
        answer: bytes | None = None
        try:
            answer = await response
        finally:
            end_request_span(span, answer, "" if answer is not None else "error")
        return answer

    async def ShouldRateLimit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        span = self._tracing.request_span(context.invocation_metadata() or ())
        response: bytes | None = None
        try:
            response = await super().ShouldRateLimit(request, context)
        finally:
            end_request_span(span, response, "" if response is not None else "error")
        return response


def end_request_span(span: Any, response: bytes | None, error: str = "") -> None:
    """End a request's span (None: not sampled) with the answer's overall code."""
    if span is None:
        return
    if span.is_recording():
        if response is not None:
            code = RateLimitResponse.FromString(response).overall_code
            span.set_attribute(OVERALL_CODE_ATTRIBUTE, RateLimitResponse.Code.Name(code))
        if error:
            span.set_attribute("rpc.grpc.status_code", error)
    span.end()


def _exporter(options: TracingOptions) -> Any:
    """OTLP over gRPC or HTTP/protobuf; the endpoint from the options, else the SDK's own
    default and OTEL_EXPORTER_OTLP_* variables."""
    endpoint = options.endpoint or None
    if options.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = endpoint is not None and endpoint.startswith("http://")
        return OTLPSpanExporter(endpoint=endpoint, insecure=insecure or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpSpanExporter(endpoint=endpoint)


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)
