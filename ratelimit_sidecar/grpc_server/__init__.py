"""The gRPC port: the HTTP/2 protocol core, its asyncio transport, the servicers."""
