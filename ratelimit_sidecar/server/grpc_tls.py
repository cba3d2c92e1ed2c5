"""TLS on the gRPC port (`--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-tls-ca-cert`): what Envoy
Gateway sets up between Envoy and its rate limit service, client certificates required when a
CA is given. gRPC asks for the certificates again before each new handshake; they are re-read
when a file changed, so a rotated Secret is served from the next connection on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import grpc

from ratelimit_sidecar.settings import Settings

log = logging.getLogger("ratelimit_sidecar.server")

Fingerprint = tuple[tuple[int, int], ...]


def files_fingerprint(paths: Iterable[Path | None]) -> Fingerprint:
    """Modification time and size of each file ((0, 0) if absent): a rotation changes it."""
    seen = []
    for path in paths:
        try:
            stat = path.stat() if path is not None else None
        except OSError:
            stat = None
        seen.append((stat.st_mtime_ns, stat.st_size) if stat is not None else (0, 0))
    return tuple(seen)


class ServerCertificates:
    """The serving certificate, key and client CA, as files; `credentials` for the server."""

    def __init__(self, cert: Path, key: Path, ca: Path | None) -> None:
        self._files = (cert, key, ca)
        self._seen = files_fingerprint(self._files)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = self._files
        return grpc.ssl_server_certificate_configuration(
            [(key.read_bytes(), cert.read_bytes())],
            root_certificates=ca.read_bytes() if ca is not None else None,
        )

    def refreshed(self) -> grpc.ServerCertificateConfiguration | None:
        """New certificates if a file changed since last read, else None (keep serving)."""
        now = files_fingerprint(self._files)
        if now == self._seen:
            return None
        try:
            configuration = self.configuration()
        except (OSError, ValueError) as exc:  # mid-rotation: keep the old ones, try again later
            log.warning("gRPC TLS files changed but cannot be read (%s): keeping the last", exc)
            return None
        self._seen = now
        log.info("gRPC TLS files changed: new connections use them")
        return configuration

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(),
            self.refreshed,
            require_client_authentication=self._files[2] is not None,
        )


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port, or None (plaintext); OSError if a file is unreadable."""
    if not settings.grpc_tls_cert or not settings.grpc_tls_key:
        return None
    ca = Path(settings.grpc_tls_ca_cert) if settings.grpc_tls_ca_cert else None
    return ServerCertificates(
        Path(settings.grpc_tls_cert), Path(settings.grpc_tls_key), ca
    ).credentials()
