"""The process: settings, the sidecar's assembly, startup, serve and drain, workers."""
