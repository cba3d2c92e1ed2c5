"""The fast gRPC transport: HTTP/2 frames on the sidecar's own asyncio loop (see docs/TRANSPORT.md)."""
