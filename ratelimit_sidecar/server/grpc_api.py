"""The gRPC surface: a thin ShouldRateLimit servicer, health and reflection on one server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.validation import InvalidRequest

log = logging.getLogger("ratelimit_sidecar.grpc")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class RateLimitServicer:
    """Delegates to the handler; only maps errors to gRPC statuses."""

    def __init__(
        self, handler: RateLimitHandler, observe_seconds: Callable[[float], None] | None = None
    ) -> None:
        self.handler = handler
        self._observe = observe_seconds

    async def ShouldRateLimit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        try:
            response = await self.handler.respond(request)
            if self._observe is not None:
                self._observe(time.perf_counter() - started)
            return response
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
        except Exception:
            log.exception("ShouldRateLimit failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the sidecar log")
            raise


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


class BindError(RuntimeError):
    """The gRPC address could not be bound (taken, or not local)."""


def build_server(
    servicer: RateLimitServicer,
    address: str,
    reuse_port: bool = False,
    more_services: Sequence[Callable[[grpc.aio.Server], str]] = (),
    *,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, health.HealthServicer, int]:
    """A started-ready server bound to `address`; returns it, its health servicer and its port.

    `more_services` add other services to the same server (the RLQS one), each returning its
    name for reflection. With `credentials` the port speaks TLS."""
    options = [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    server = grpc.aio.server(options=options)
    add_rate_limit_service(server, servicer)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        wire.SERVICE_NAME,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        *(add(server) for add in more_services),
    )
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise BindError(f"cannot listen on {address}: {exc}") from exc
    if port == 0 and not address.endswith(":0"):
        raise BindError(f"cannot listen on {address}: address in use or not available")
    return server, health_servicer, port
