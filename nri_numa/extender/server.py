"""The extender's HTTP server: ``POST <prefix>/filter``, ``/prioritize`` and ``/bind`` with JSON
bodies, as kube-scheduler's HTTPExtender sends them; ``GET /healthz``.

Bodies are bounded before they are read and parsed with the bounded JSON reader; a request the
server cannot read gets a 400 with one line, never a traceback.

With a TLS context (``tls_context``) every connection must present a client certificate signed
by the client CA: the handshake runs in the connection's own thread, bounded by
``HANDSHAKE_SECONDS``, and a connection that fails it is closed with one log line, before any
request of it is read (one closed before saying anything, as a TCP readiness probe does, is
logged at debug level only).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nri_numa.extender.verbs import Extender
from nri_numa.safeio.documents import DocumentError, load_json

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # bytes: a 5000-node NodeList when the scheduler is not cache-capable
HANDSHAKE_SECONDS = 10.0
IDLE_SECONDS = 300.0  # a kept-alive connection with no request for this long is closed


class TlsError(ValueError):
    """Certificate files that cannot make a server context; the message is one line."""


def tls_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """A server context that presents ``cert_file`` and admits only clients whose certificate
    ``client_ca_file`` signed (TLS 1.2 or later)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    for what, load in ((f"--tls-cert {cert_file} / --tls-key {key_file}",
                        lambda: context.load_cert_chain(cert_file, key_file)),
                       (f"--client-ca {client_ca_file}",
                        lambda: context.load_verify_locations(cafile=client_ca_file))):
        try:
            load()
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"{what}: {' '.join(str(e.strerror or e).split())[:200]}") from None
    return context


class ExtenderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], extender: Extender, prefix: str = "",
                 tls: ssl.SSLContext | None = None) -> None:
        self.extender = extender
        self.prefix = prefix.rstrip("/")
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            request.settimeout(IDLE_SECONDS)
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_SECONDS)
        try:
            connection = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLEOFError, ConnectionError) as e:  # closed unheard: a TCP probe, not a request
            log.debug("a connection from %s closed before its TLS handshake: %s",
                      client_address[0], e)
            return
        except (OSError, ssl.SSLError) as e:
            log.warning("refused a connection from %s: TLS handshake failed (%s)",
                        client_address[0],
                        " ".join(str(getattr(e, "reason", None) or e).split())[:200])
            return
        try:
            connection.settimeout(IDLE_SECONDS)
            super().finish_request(connection, client_address)
        finally:
            connection.close()


class _Handler(BaseHTTPRequestHandler):
    server: ExtenderServer
    protocol_version = "HTTP/1.1"  # the scheduler's client keeps connections open

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True  # the body is not read: the connection cannot go on
            self._send(400, f"Content-Length must be a number of bytes up to {MAX_BODY}\n"
                       .encode(), "text/plain")
            return
        body = self.rfile.read(int(length))  # even for an unknown verb: the next request follows
        verb = self.path[len(self.server.prefix):] if self.path.startswith(
            self.server.prefix) else ""
        handler = {"/filter": self.server.extender.filter,
                   "/prioritize": self.server.extender.prioritize,
                   "/bind": self.server.extender.bind}.get(verb)
        if handler is None:
            self._send(404, f"no verb {self.path[:80]!r}\n".encode(), "text/plain")
            return
        try:
            args = load_json(body, "request")
        except DocumentError as e:
            self._send(400, (" ".join(str(e).split())[:300] + "\n").encode(), "text/plain")
            return
        try:
            answer = handler(args)
        except Exception:  # a bug of ours must not cost the scheduler its connection
            log.exception("%s failed", verb)
            answer = {"Error": f"nri-numa extender: {verb[1:]} failed; see its log"}
        self._send(200, json.dumps(answer).encode(), "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
