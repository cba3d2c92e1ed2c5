"""The gRPC port's protocol core: HTTP/2 and gRPC calls without I/O (connection.py)."""
