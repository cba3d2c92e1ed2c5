"""The one exception a handler raises to end its call with a gRPC status."""

from __future__ import annotations

import grpc


class CallError(Exception):
    """End the call with `code` and `message` (a grpc.StatusCode, as grpc's servicers use)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
