"""Certificates for mTLS tests of the xDS client, made with the `openssl` command.

`make_pki(dir, "ca")` makes a CA and, signed by it, a server certificate for 127.0.0.1 and the
name `xds.test`, and a client certificate whose common name is `client`; `client_cert` makes
another client certificate (for rotations).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAME = "xds.test"
EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pki:
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found on PATH: apt-get install openssl")
    subprocess.run([openssl, *args], check=True, capture_output=True, cwd=cwd)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subj = f"/CN={name}"
    _openssl("req", "-x509", *EC, "-days", "2", "-keyout", str(key), "-out", str(cert),
             "-subj", subj, cwd=directory)  # fmt: skip
    return cert, key


def signed_cert(ca: tuple[Path, Path], name: str, extension: str) -> tuple[Path, Path]:
    """A certificate `name`.pem / .key beside the CA, signed by it, with `extension` lines."""
    directory = ca[0].parent
    cert, key, csr = (directory / f"{name}{suffix}" for suffix in (".pem", ".key", ".csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(extension + "\n")
    _openssl("req", *EC, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
             cwd=directory)  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(ext),
             cwd=directory)  # fmt: skip
    return cert, key


def client_cert(ca: tuple[Path, Path], name: str) -> tuple[Path, Path]:
    return signed_cert(ca, name, "extendedKeyUsage=clientAuth")


def make_pki(directory: Path, name: str = "ca") -> Pki:
    ca = make_ca(directory, name)
    server = signed_cert(
        ca, "server", f"subjectAltName=IP:127.0.0.1,DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth"
    )
    client = client_cert(ca, "client")
    return Pki(*ca, *server, *client)
