"""The part of grpc.aio's ServicerContext that grpc's own servicers (health, reflection) and
the RLQS servicer use, over one call of the fast transport."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from ratelimit_sidecar.grpc_server.transport.status import CallError


class CallSide(Protocol):
    """What a context needs of its call (grpc_server/transport/calls.py)."""

    deadline: float | None

    def send_message(self, message: bytes) -> None: ...

    def flush(self) -> None: ...

    async def wait_drained(self) -> None: ...

    def cancelled(self) -> bool: ...

    def peer(self) -> str: ...


async def invoke(handler: Any, request: Any, context: Context) -> None:
    """Run a grpc RpcMethodHandler's function whichever of grpc's four shapes it has."""
    function = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    result = function(request, context)
    if inspect.isasyncgen(result):
        async for response in result:
            await context.write(response)
        return
    response = await result
    if not handler.response_streaming and response is not None:
        await context.write(response)


class Context:
    """A call's context: writes, status, deadline."""

    def __init__(self, call: CallSide, serialize: Callable[[Any], bytes] | None) -> None:
        self._call = call
        self._code = grpc.StatusCode.OK
        self._details = ""
        self._serialize = serialize or (lambda message: message)

    async def write(self, message: Any) -> None:
        self._call.send_message(self._serialize(message))
        self._call.flush()
        await self._call.wait_drained()

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: object) -> None:
        raise CallError(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def status(self) -> tuple[grpc.StatusCode, str]:
        return self._code, self._details

    def peer(self) -> str:
        return self._call.peer()

    def cancelled(self) -> bool:
        return self._call.cancelled()

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else deadline - asyncio.get_running_loop().time()

    def invocation_metadata(self) -> tuple[()]:
        return ()
