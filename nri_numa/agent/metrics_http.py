"""``GET /metrics`` over HTTP from a daemon thread, one request per connection.

Built on socketserver with a parser of its own for the request line and headers: http.server,
wsgiref and urllib would load email, ssl and more (megabytes of the agent's memory), and a
scrape needs none of it. Each connection has a thread and a deadline: a client that sends too
little, too slowly or too much is dropped without holding up the next scrape.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PATH = "/metrics"
MAX_HEAD_BYTES = 8192  # request line and headers; a scraper sends a few hundred
HEAD_DEADLINE_S = 5.0  # to send them all, however the bytes trickle in
SEND_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16  # in flight at once; more are closed at once, unanswered

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class _BadHead(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def read_head(sock: socket.socket, deadline: float) -> bytes:
    """The bytes up to the blank line that ends the headers (bare LF line ends too)."""
    buffer = b""
    while True:
        ends = [at for at in (buffer.find(b"\r\n\r\n"), buffer.find(b"\n\n")) if at >= 0]
        if ends and min(ends) <= MAX_HEAD_BYTES:
            return buffer[:min(ends)]
        if len(buffer) > MAX_HEAD_BYTES:
            raise _BadHead(431)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request head not sent in time")
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the end of the request head")
        buffer += chunk


def request_target(head: bytes) -> tuple[str, str]:
    """(method, path without the query) from the request line."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/") or not parts[1].startswith(b"/"):
        raise _BadHead(400)
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _BadHead(400) from None
    return method, target.split("?", 1)[0]


def response(status: int, body: bytes, content_type: str, head_only: bool = False,
             extra: str = "") -> bytes:
    head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode("ascii") + (b"" if head_only else body)


class _Scrape(socketserver.BaseRequestHandler):
    server: ScrapeServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            reply = self._reply(read_head(sock, time.monotonic() + HEAD_DEADLINE_S))
        except _BadHead as e:
            reply = response(e.status, REASONS[e.status].encode() + b"\n", "text/plain")
        except OSError:  # slow, silent or gone: nobody to answer
            return
        try:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendall(reply)
        except OSError:
            pass

    def _reply(self, head: bytes) -> bytes:
        method, path = request_target(head)
        if path != PATH:
            return response(404, b"Not Found: metrics are at /metrics\n", "text/plain")
        if method not in ("GET", "HEAD"):
            return response(405, b"Method Not Allowed\n", "text/plain",
                            extra="Allow: GET, HEAD\r\n")
        try:
            body = self.server.render()
        except Exception:  # a scrape must never take the server down
            log.exception("metrics: cannot render a scrape")
            return response(500, b"Internal Server Error\n", "text/plain")
        return response(200, body, self.server.content_type, head_only=method == "HEAD")


class ScrapeServer(socketserver.ThreadingTCPServer):
    """Listens on (host, port); ``render`` gives the body of each scrape."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True  # a restarted agent gets its port back despite TIME_WAIT

    def __init__(self, host: str, port: int, render: Callable[[], bytes],
                 content_type: str) -> None:
        # socket.gaierror (an OSError) when the host name does not resolve.
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self.render, self.content_type = render, content_type
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(sockaddr, _Scrape)

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request,  # type: ignore[no-untyped-def]
                               client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(host: str, port: int, render: Callable[[], bytes],
          content_type: str) -> tuple[ScrapeServer, threading.Thread]:
    """A server answering on a daemon thread of its own; OSError when it cannot listen."""
    server = ScrapeServer(host, port, render, content_type)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
