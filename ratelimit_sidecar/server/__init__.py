"""The process edge: gRPC server, sync loop, lifecycle."""
