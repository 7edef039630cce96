"""The hook daemon's inbox: every connected hook's request read as it comes in, and handed out
as each is read whole.

The daemon runs one hook at a time, but it must not wait on one connection while others have
their request in. It once read each connection in turn, with a 2 s limit: under a burst a hook
that had connected and not yet written (its process starved of CPU, or still reading its stdin)
held the whole queue for those 2 s, and the hooks behind it reached their deadlines. Here every
connection is read without blocking, whole requests queue, and a connection that never completes
one is dropped after ``idle_s``, long after its hook's deadline.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nri_numa.hook.client import MAX_LINE

IDLE_S = 60.0  # no hook waits that long: its runtime has killed it by then

log = logging.getLogger("nri_numa.hook.daemon")


@dataclass
class _Partial:
    since: float
    data: bytearray = field(default_factory=bytearray)


class Inbox:
    """``next()`` blocks until a hook's whole request is in and returns its connection (blocking
    again, for the answer) and the request line. Close it to close every connection it holds."""

    def __init__(self, listener: socket.socket, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listener = listener
        self._idle_s = idle_s
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._partial: dict[socket.socket, _Partial] = {}
        self._ready: deque[tuple[socket.socket, bytes]] = deque()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def next(self) -> tuple[socket.socket, bytes]:
        while not self._ready:
            for key, _ in self._selector.select(self._wait()):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._drop_idle()
        conn, line = self._ready.popleft()
        conn.setblocking(True)
        return conn, line

    def close(self) -> None:
        for conn in [*self._partial, *(c for c, _ in self._ready)]:
            conn.close()
        self._partial.clear()
        self._ready.clear()
        self._selector.close()

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait(self) -> float | None:
        if not self._partial:
            return None
        oldest = min(p.since for p in self._partial.values())
        return max(oldest + self._idle_s - self._clock(), 0.0)

    def _accept(self) -> None:
        while True:  # everyone waiting in the backlog, so that all of them are read
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            self._partial[conn] = _Partial(self._clock())
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        partial = self._partial[conn]
        try:
            chunk = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(conn, str(e))
            return
        if not chunk:
            self._drop(conn, "the connection closed before a whole line came")
            return
        end = chunk.find(b"\n")
        if end < 0:
            partial.data += chunk
            if len(partial.data) > MAX_LINE:
                self._drop(conn, f"a line longer than {MAX_LINE} bytes")
            return
        partial.data += chunk[:end]
        self._forget(conn)
        self._ready.append((conn, bytes(partial.data)))

    def _drop_idle(self) -> None:
        now = self._clock()
        for conn, partial in list(self._partial.items()):
            if now - partial.since >= self._idle_s:
                self._drop(conn, f"no whole request within {self._idle_s:g} s")

    def _drop(self, conn: socket.socket, why: str) -> None:
        log.warning("dropped a client: %s", why)
        self._forget(conn)
        conn.close()

    def _forget(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        del self._partial[conn]
