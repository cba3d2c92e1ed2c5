"""The HTTP side: one small HTTP/1.1 server and its routes (health, metrics, debug, admin)."""
