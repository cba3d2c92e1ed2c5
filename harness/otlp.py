"""An OTLP trace receiver on loopback, both ways the SDK exports: gRPC `TraceService/Export`
and HTTP `POST /v1/traces` (protobuf). Tests read the spans it received."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from harness.net import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


class OtlpReceiver:
    """`grpc_endpoint` and `http_endpoint` for the exporter; `spans` as they arrive."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
        add(_GrpcExport(self), self._grpc)  # type: ignore[no-untyped-call]
        grpc_port = self._grpc.add_insecure_port(f"127.0.0.1:{free_port()}")
        self.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(self))
        self.http_endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._grpc.stop(0)
        self._http.shutdown()
        self._http.server_close()

    def receive(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        found = [
            ReceivedSpan(
                span.name,
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                {a.key: _value(a.value) for a in span.attributes},
            )
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.spans.extend(found)

    def wait_for(
        self,
        name: str | None,
        where: Callable[[ReceivedSpan], bool] = lambda _span: True,
        timeout_s: float = 15.0,
    ) -> list[ReceivedSpan]:
        """The spans called `name` (None: any) that `where` accepts, once one has arrived
        (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                found = [s for s in self.spans if name in (None, s.name) and where(s)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {name!r} span within {timeout_s:g} s; got {self.spans}")


class _GrpcExport(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, _context: Any) -> Any:
        self._receiver.receive(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/v1/traces":
                receiver.receive(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
            else:
                self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
