"""Certificates for the tests, made with Debian's openssl: a CA, and server or client
certificates it signs (the extender's TLS, as kube-scheduler's tlsConfig uses it). They carry
the extensions a strict verifier asks for (Python 3.13's default context sets
VERIFY_X509_STRICT): the CA's key usage, each certificate's key identifiers."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> KeyPair:
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(pair.key), "-out", str(pair.cert))
    return pair


def make_signed(folder: Path, name: str, ca: KeyPair, *, server: bool, subject: str = "",
                extra_names: tuple[str, ...] = ()) -> KeyPair:
    """A certificate for ``name`` signed by ``ca``: for serving 127.0.0.1 and localhost (and
    ``extra_names``, subjectAltName entries such as "DNS:kubernetes.default.svc") when
    ``server``, else for a client. ``subject``: an openssl subject in place of /CN=<name>
    (a Kubernetes client's user and groups: /O=<group>/CN=<user>)."""
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    request = folder / f"{name}.csr"
    extensions = folder / f"{name}.ext"
    extensions.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        + (f"subjectAltName={','.join(('IP:127.0.0.1', 'DNS:localhost', *extra_names))}\n"
           "extendedKeyUsage=serverAuth\n" if server
           else "extendedKeyUsage=clientAuth\n"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject or f"/CN={name}",
             "-keyout", str(pair.key), "-out", str(request))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
             "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(pair.cert))
    return pair
