"""The one error of a listener that cannot start, whichever server it belongs to.

The gRPC port (grpc_server/rls.py), the HTTP addresses and the admin API's token
(http_server/) raise it; `serve` (app/run.py) turns it into one line and exit status 1.
"""

from __future__ import annotations


class BindError(RuntimeError):
    """An address could not be bound (taken, or not local), or what a listener needs to open
    (its TLS settings, the admin token) is not usable."""
