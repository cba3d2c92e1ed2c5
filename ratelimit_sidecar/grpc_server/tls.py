"""TLS and mTLS on the gRPC port, with certificate files re-read when they change on disk.

cert-manager and Kubernetes secrets rotate a certificate by replacing its files. Each new
connection's handshake uses the files as they are then (looked at no more than once a second);
a connection already open keeps the certificate it was made with. A missing or invalid file at
start stops the start with one line naming it; at a rotation the last good files keep serving,
and the failure is logged once per change and counted.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("ratelimit_sidecar.tls")

RECHECK_S = 1.0  # how often a handshake may look at the files' modification times
_PEM = {"certificate": b"-----BEGIN CERTIFICATE-----", "key": b"PRIVATE KEY-----"}


class TlsError(ValueError):
    """A TLS file that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The gRPC port's certificate chain and key, and the CA client certificates must chain to
    (mTLS: then every client must present one), optionally with a SAN it must carry."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    client_san: str | None = None

    def paths(self) -> tuple[Path, ...]:
        pair = (self.cert, self.key)
        return pair if self.client_ca is None else (*pair, self.client_ca)

    def fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Modification time and size of each file: a rotation changes it."""
        found = []
        for path in self.paths():
            try:
                stat = path.stat()
                found.append((stat.st_mtime_ns, stat.st_size))
            except OSError:
                found.append((0, 0))
        return tuple(found)


@dataclass(frozen=True, slots=True)
class Loaded:
    """One good reading of the files: for asyncio servers and for grpcio."""

    context: ssl.SSLContext
    grpc_config: Any  # grpc.ServerCertificateConfiguration


def load(files: TlsFiles) -> Loaded:
    """Read and check every file; TlsError naming the one that is wrong."""
    cert = _read(files.cert, "certificate")
    key = _read(files.key, "key")
    ca = _read(files.client_ca, "certificate") if files.client_ca is not None else None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise TlsError(f"{files.key} does not match {files.cert}: {exc.reason}") from None
    if ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
    config = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
    return Loaded(context, config)


def _read(path: Path, kind: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the TLS {kind} {path}: {exc.strerror}") from None
    if _PEM[kind] not in data:
        raise TlsError(f"{path} holds no PEM {kind}")
    return data


class ServerTls:
    """The files in force; `current()` re-reads them once they change."""

    def __init__(
        self,
        files: TlsFiles,
        *,
        on_error: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self.loaded = load(files)  # TlsError at start: the caller stops with its message
        self._seen = files.fingerprint()
        self.on_error = on_error  # counts a rotation that could not be used (metrics)
        self._clock = clock
        self._checked = clock()
        self.loaded.context.sni_callback = self._on_hello

    def current(self) -> Loaded:
        now = self._clock()
        if now - self._checked < RECHECK_S:
            return self.loaded
        self._checked = now
        seen = self.files.fingerprint()
        if seen != self._seen:
            self._seen = seen
            self._reload()
        return self.loaded

    def _reload(self) -> None:
        try:
            loaded = load(self.files)
        except (TlsError, ssl.SSLError) as exc:
            log.error("TLS files changed but cannot be used; still serving the last good: %s", exc)
            if self.on_error is not None:
                self.on_error()
            return
        loaded.context.sni_callback = self._on_hello
        self.loaded = loaded
        log.info("TLS files reloaded: %s", ", ".join(str(p) for p in self.files.paths()))

    def _on_hello(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        """Every handshake of the listening context: switch it to the newest files."""
        context = self.current().context
        if connection.context is not context:
            connection.context = context

    def server_context(self) -> ssl.SSLContext:
        """For an asyncio server: the context it listens with (it switches per handshake)."""
        return self.loaded.context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """For grpcio: its fetcher runs before every handshake; a new config on a change."""
        served = [self.loaded]

        def fetch() -> Any:
            loaded = self.current()
            if loaded is served[0]:
                return None  # no change: grpc keeps its own
            served[0] = loaded
            return loaded.grpc_config

        required = self.files.client_ca is not None
        return grpc.dynamic_ssl_server_credentials(
            served[0].grpc_config, fetch, require_client_authentication=required
        )

    def peer_allowed(self, peer: dict[str, Any] | None) -> bool:
        """With a required SAN, whether the client certificate names it (DNS, URI, IP...)."""
        san = self.files.client_san
        if san is None:
            return True
        names = (value for _kind, value in (peer or {}).get("subjectAltName", ()))
        return san in names
