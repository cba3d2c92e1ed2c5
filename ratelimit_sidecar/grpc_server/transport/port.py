"""What every connection of one gRPC server shares."""

from __future__ import annotations

from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Counters
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.tls import ServerTls
from ratelimit_sidecar.grpc_server.transport.admission import Admission, default_max_connections
from ratelimit_sidecar.grpc_server.transport.methods import Methods
from ratelimit_sidecar.grpc_server.transport.options import PortOptions


class Port:
    """What every connection of one server shares: methods, bounds, the message budget, the
    trip counters and the set of connections."""

    def __init__(self, options: PortOptions, tls: ServerTls | None) -> None:
        self.options, self.tls = options, tls
        self.methods = Methods()
        self.budget = MessageBudget(options.pending_bytes)
        self.counters = Counters()
        limit = options.max_connections or default_max_connections()
        self.admission = Admission(limit, options.max_connections_per_peer)

    def new_core(self, now: float) -> Connection:
        return Connection(self.options.limits, self.budget, self.methods.route, now, self.counters)

    def trips(self) -> dict[str, int]:
        """How often each bound tripped, for the metrics (read at scrape time)."""
        admission = self.admission
        return {
            **self.counters.as_dict(),
            "connections_evicted": admission.evicted,
            "connections_refused": admission.refused,
            "tls_handshake_timeouts": admission.tls_timeouts,
            "tls_handshake_failures": admission.tls_failures,
        }

    def pending_bytes(self) -> int:
        return self.budget.used
