"""A TLS-terminating TCP proxy in front of a plain Redis port, for `rediss://` tests.

The bundled valkey-server is built without TLS (`--tls-port` fails with "Failed finding TLS
support"), so TLS is exercised this way: the client's side (rediss://, certificate checks,
hostname checks) is real; the server's TLS is Python's `ssl` module instead of Redis's.
The certificate is self-signed for IP 127.0.0.1, made with the `openssl` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from pathlib import Path


def make_cert(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem), self-signed, valid for 127.0.0.1; needs `openssl` on PATH."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found on PATH")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-nodes", "-days", "2"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class TlsProxy:
    """Accepts TLS on `port` (127.0.0.1) and relays bytes to `backend_port`, in a thread."""

    def __init__(self, backend_port: int, cert: Path, key: Path) -> None:
        self.backend_port = backend_port
        self.cert = cert
        self.port = 0
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self._context)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        # A connection task must never end cancelled: asyncio's stream callback of Python 3.11
        # logs "Exception in callback" for that at shutdown.
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay_open(client_r, client_w)

    async def _relay_open(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        self._writers.add(client_w)
        try:
            backend_r, backend_w = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            await _close(client_w)
            self._writers.discard(client_w)
            return
        self._writers.add(backend_w)
        try:
            await asyncio.gather(_pipe(client_r, backend_w), _pipe(backend_r, client_w))
        finally:
            for writer in (client_w, backend_w):
                await _close(writer)
                self._writers.discard(writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    # Half-close is not worth the trouble here: one side ending ends the relay.
    await _close(writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1)
