"""The gRPC surface: a thin ShouldRateLimit servicer, health and reflection on one server.

The server is the fast transport (grpc_server/transport/) or grpc.aio's (`--transport grpcio`);
both take the same services through grpc's registration calls.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from mypy_extensions import mypyc_attr

from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.bind import BindError
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.transport.options import PortOptions
from ratelimit_sidecar.grpc_server.transport.server import FastServer, accepts
from ratelimit_sidecar.grpc_server.transport.status import CallError
from ratelimit_sidecar.service.ratelimit import RateLimitHandler, StoreNeeded
from ratelimit_sidecar.service.validation import InvalidRequest

log = logging.getLogger("ratelimit_sidecar.grpc")

TIMED_EVERY: Final = 16  # calls per call timed for ratelimit_sidecar_decision_seconds
UNTIMED: Final = 0.0  # the start of a call left out of the timed sample


@mypyc_attr(allow_interpreted_subclasses=True)  # grpc_server/tracing.py's TracedServicer
class RateLimitServicer:
    """Delegates to the handler; only maps errors to gRPC statuses, and times a sample of
    calls for the decision histogram."""

    def __init__(
        self, handler: RateLimitHandler, observe_seconds: Callable[[float], None] | None = None
    ) -> None:
        self.handler = handler
        self._observe = observe_seconds
        self._calls_until_timed = 0
        # A servicer that reads the call's headers (tracing) answers through this instead.
        self.answer_with_headers: (
            Callable[[list[tuple[bytes, bytes]], bytes], bytes | Awaitable[bytes]] | None
        ) = None

    def answer(self, request: bytes) -> bytes | Awaitable[bytes]:
        """The response's wire bytes, or an awaitable of them (a strict rule waits for Redis);
        raises CallError with the status of a bad request."""
        self._calls_until_timed -= 1
        started = self._start_timing() if self._calls_until_timed < 0 else UNTIMED
        try:
            response = self.handler.respond_now(request)
        except StoreNeeded as needed:
            return self._answer_from_store(request, needed, started)
        except Exception as exc:
            raise _status_of(exc) from exc
        if started != UNTIMED and self._observe is not None:
            self._observe(time.perf_counter() - started)
        return response

    def _start_timing(self) -> float:
        """This call is one of the sample: the clock at its start. Only a sample is timed: two
        clock reads and a histogram update would weigh on every decision (docs/PERFORMANCE.md)."""
        self._calls_until_timed = TIMED_EVERY - 1 if self._observe is not None else sys.maxsize
        return time.perf_counter()

    async def _answer_from_store(
        self, request: bytes, needed: StoreNeeded, started: float
    ) -> bytes:
        try:
            answer = await self.handler.respond_strict(request, needed.compiled)
        except Exception as exc:
            raise _status_of(exc) from exc
        if started != UNTIMED and self._observe is not None:
            self._observe(time.perf_counter() - started)
        return answer

    async def ShouldRateLimit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The grpc.aio method: `answer`, its CallError as an aborted call."""
        try:
            response = self.answer(request)
            return response if isinstance(response, bytes) else await response
        except CallError as exc:
            await context.abort(exc.code, exc.message)
            raise  # unreachable: abort raises


def _status_of(exc: Exception) -> CallError:
    if isinstance(exc, InvalidRequest):
        return CallError(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    log.error("ShouldRateLimit failed", exc_info=exc)
    return CallError(grpc.StatusCode.INTERNAL, "internal error; see the sidecar log")


def rate_limit_methods(servicer: RateLimitServicer) -> dict[str, grpc.RpcMethodHandler]:
    """ShouldRateLimit on wire bytes both ways: the handler parses a request only the first time
    it sees those bytes (see service.compiled), and encodes its answer itself."""
    method = grpc.unary_unary_rpc_method_handler(
        servicer.ShouldRateLimit,
        request_deserializer=None,  # the handler gets the request's wire bytes
        response_serializer=None,  # the response is already wire bytes
    )
    return {"ShouldRateLimit": method}


def add_rate_limit_service(server: grpc.aio.Server, servicer: RateLimitServicer) -> None:
    """Register ShouldRateLimit both ways grpc offers: as a generic handler (for lookups by
    name) and as a registered method, which grpc's core matches itself, saving the per-call
    generic-handler lookup in Python."""
    methods = rate_limit_methods(servicer)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(wire.SERVICE_NAME, methods),)
    )
    server.add_registered_method_handlers(wire.SERVICE_NAME, methods)


def build_server(
    servicer: RateLimitServicer,
    address: str,
    reuse_port: bool = False,
    more_services: Sequence[Callable[[Any], str]] = (),
    transport: str = "fast",
    *,
    tls: ServerTls | None = None,
    options: PortOptions | None = None,
) -> tuple[Any, health.HealthServicer, int]:
    """A started-ready server bound to `address`; returns it, its health servicer and its port.

    `transport` is "fast" (grpc_server/transport/) or "grpcio"; `more_services` add other services
    to the same server (the RLQS one), each returning its name for reflection. With `tls` the
    port speaks TLS (mTLS with a client CA), on either transport; `options` bound what a peer may
    make the port hold (grpcio applies the message size and the connection age alone)."""
    server, port = _bind(address, reuse_port, transport, tls, options or PortOptions())
    if isinstance(server, FastServer) and servicer.answer_with_headers is not None:
        server.add_fast_unary_with_headers(wire.METHOD_PATH, servicer.answer_with_headers)
    elif isinstance(server, FastServer):
        server.add_fast_unary(wire.METHOD_PATH, servicer.answer)
    else:
        add_rate_limit_service(server, servicer)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        wire.SERVICE_NAME,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        *(add(server) for add in more_services),
        reflection.SERVICE_NAME,
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(names), server
    )
    return server, health_servicer, port


def _bind(
    address: str,
    reuse_port: bool,
    transport: str,
    tls: ServerTls | None,
    options: PortOptions,
) -> tuple[Any, int]:
    if transport == "fast" and not accepts(address):
        log.warning("the fast transport cannot listen on %s: serving it with grpcio", address)
        transport = "grpcio"
    if transport == "fast":
        try:
            server = FastServer(address, reuse_port, options, tls)
        except (OSError, ValueError) as exc:
            raise BindError(f"cannot listen on {address}: {exc}") from exc
        return server, server.port
    channel_args = [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", options.limits.max_message_bytes),
    ]
    max_age = options.max_age
    if max_age is not None:
        channel_args += [
            ("grpc.max_connection_age_ms", int(max_age[0] * 1000)),
            ("grpc.max_connection_age_grace_ms", int(max_age[1] * 1000)),
        ]
    if tls is not None and tls.files.client_san is not None:
        raise BindError("--grpc-tls-client-san is checked by the fast transport only, not grpcio")
    server = grpc.aio.server(options=channel_args)
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError as exc:
        raise BindError(f"cannot listen on {address}: {exc}") from exc
    if port == 0 and not address.endswith(":0"):
        raise BindError(f"cannot listen on {address}: address in use or not available")
    return server, port
