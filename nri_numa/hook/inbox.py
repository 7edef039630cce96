"""The hook daemon's inbox: every connected hook's request read as it comes in, and handed out
as each is read whole (the wire: nri_numa.hook.client).

The daemon runs one hook at a time, but it must not wait on one connection while others have
their request in. It once read each connection in turn, with a 2 s limit: under a burst a hook
that had connected and not yet written (its process starved of CPU, or still reading its stdin)
held the whole queue for those 2 s, and the hooks behind it reached their deadlines. Here every
connection is read without blocking, whole requests queue, and a connection that never completes
one is dropped after ``idle_s``, long after its hook's deadline.

A request is complete when the client has shut down its side: its arguments, each ended by a NUL
byte, and the three standard descriptors that came with them. When each hook process started is
read as it is accepted (its pid from ``SO_PEERCRED``), for its deadline.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nri_numa.hook.client import STANDARD_FDS
from nri_numa.hook.deadline import peer_started

IDLE_S = 60.0  # no hook waits that long: its runtime has killed it by then
MAX_REQUEST = 1 << 20  # a hook's arguments are a few hundred bytes; this stops a runaway peer

log = logging.getLogger("nri_numa.hook.daemon")


@dataclass
class _Partial:
    since: float
    started: float  # when the hook process started, a time.monotonic() value
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Request:
    """One hook run: its connection (blocking, for the answer), its arguments, its stdin, stdout
    and stderr, and when its process started (a ``time.monotonic()`` value)."""

    conn: socket.socket
    args: list[str]
    fds: list[int]
    started: float

    def close_fds(self) -> None:
        _close(self.fds)
        self.fds.clear()

    def close(self) -> None:
        self.close_fds()
        self.conn.close()


class Inbox:
    """``next()`` blocks until a hook's whole request is in and returns it. Close it to close
    every connection and descriptor it holds."""

    def __init__(self, listener: socket.socket, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listener = listener
        self._idle_s = idle_s
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._partial: dict[socket.socket, _Partial] = {}
        self._ready: deque[Request] = deque()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def next(self) -> Request:
        while not self._ready:
            for key, _ in self._selector.select(self._wait()):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._drop_idle()
        request = self._ready.popleft()
        request.conn.setblocking(True)
        return request

    def close(self) -> None:
        for conn, partial in self._partial.items():
            _close(partial.fds)
            conn.close()
        for request in self._ready:
            request.close()
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
            self._partial[conn] = _Partial(self._clock(), peer_started(conn))
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        partial = self._partial[conn]
        try:
            chunk, fds, flags, _ = socket.recv_fds(conn, 1 << 16, len(STANDARD_FDS),
                                                   socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(conn, str(e))
            return
        partial.fds += fds
        if flags & socket.MSG_CTRUNC or len(partial.fds) > len(STANDARD_FDS):
            self._drop(conn, f"more than {len(STANDARD_FDS)} descriptors")
        elif chunk:
            partial.data += chunk
            if len(partial.data) > MAX_REQUEST:
                self._drop(conn, f"a request longer than {MAX_REQUEST} bytes")
        elif len(partial.fds) != len(STANDARD_FDS) or not partial.data.endswith(b"\0"):
            self._drop(conn, "the connection closed before a whole request came")
        else:
            self._forget(conn)
            args = [os.fsdecode(arg) for arg in bytes(partial.data[:-1]).split(b"\0")]
            self._ready.append(Request(conn, args, partial.fds, partial.started))

    def _drop_idle(self) -> None:
        now = self._clock()
        for conn, partial in list(self._partial.items()):
            if now - partial.since >= self._idle_s:
                self._drop(conn, f"no whole request within {self._idle_s:g} s")

    def _drop(self, conn: socket.socket, why: str) -> None:
        log.warning("dropped a client: %s", why)
        _close(self._partial[conn].fds)
        self._forget(conn)
        conn.close()

    def _forget(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        del self._partial[conn]


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
