"""The fast gRPC transport: HTTP/2 on the sidecar's own asyncio loop (docs/TRANSPORT.md)."""
