"""NRI's connection multiplexer: several logical byte streams over one unix socket.

Every frame is ``conn id (u32 BE) | payload length (u32 BE) | payload``. Frame boundaries carry no
meaning: each logical connection is a byte stream that the layer above (ttrpc) cuts into messages.

One reader thread owns the socket's receiving side and hands each frame's payload to the sink
attached for its connection id. Writers share one lock, so the frames of one message are never
interleaved with another message's. Any protocol violation, a sink that fails, or the peer going
away closes the whole mux once, with a reason every sink is told.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from typing import Protocol

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">II")
# containerd hands each frame to a 4096-byte bufio.Reader; a longer frame kills its ttrpc server.
MAX_OUTGOING_FRAME_PAYLOAD = 4096
# The Go mux refuses to write payloads over 16 MiB, so nothing longer can be legitimate.
MAX_INCOMING_FRAME_PAYLOAD = 1 << 24
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
# A write that cannot make progress for this long means the peer stopped reading: give up.
DEFAULT_WRITE_TIMEOUT = 5.0
JOIN_TIMEOUT = 2.0
_RECV_CHUNK = 1 << 16


class ConnectionClosed(Exception):
    """The mux is closed; ``reason`` says why (peer EOF, protocol error, local close)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProtocolError(Exception):
    """The peer sent bytes that break the protocol; the mux closes with this message as reason."""


class ConnectionSink(Protocol):
    """Receives one logical connection's bytes. Called on the mux's reader thread only."""

    def feed(self, data: bytes) -> None: ...

    def connection_lost(self, reason: str) -> None: ...


class Mux:
    """The multiplexed trunk over one connected ``SOCK_STREAM`` socket, which it owns."""

    def __init__(self, sock: socket.socket, write_timeout: float = DEFAULT_WRITE_TIMEOUT) -> None:
        self._sock = sock
        # The timeout bounds blocking writes; the reader treats a receive timeout as "keep waiting".
        self._sock.settimeout(write_timeout)
        self._sinks: dict[int, ConnectionSink] = {}
        self._write_lock = threading.Lock()
        self._state_lock = threading.RLock()  # close() may come from a signal handler
        self._closed = threading.Event()
        self._reason = ""
        self._reader: threading.Thread | None = None

    @property
    def closed(self) -> threading.Event:
        return self._closed

    @property
    def reason(self) -> str:
        return self._reason

    def attach(self, conn_id: int, sink: ConnectionSink) -> None:
        if self._reader is not None:
            raise RuntimeError("attach connections before starting the mux")
        if not 0 < conn_id <= 0xFFFFFFFF:
            raise ValueError(f"connection id {conn_id} is outside 1..2^32-1 (0 is reserved)")
        self._sinks[conn_id] = sink

    def start(self) -> None:
        if self._reader is not None:
            raise RuntimeError("the mux is already started")
        self._reader = threading.Thread(target=self._read_loop, name="nri-mux-reader", daemon=True)
        self._reader.start()

    def send(self, conn_id: int, data: bytes) -> None:
        """Writes ``data`` on ``conn_id`` as frames of at most 4096 bytes, all under the write lock.

        Raises ConnectionClosed when the mux is closed or the write fails (which closes it).
        """
        if len(data) > MAX_INCOMING_FRAME_PAYLOAD:
            raise ValueError(f"refusing to send {len(data)} bytes on connection {conn_id}: over 16 MiB")
        wire = encode_frames(conn_id, data)
        with self._write_lock:
            if self._closed.is_set():
                raise ConnectionClosed(self._reason)
            try:
                self._sock.sendall(wire)
            except OSError as exc:
                # A partial write leaves the trunk out of step with the peer: it cannot continue.
                reason = f"write to the runtime failed: {_describe_os_error(exc)}"
                self._shutdown(reason)
                raise ConnectionClosed(self._reason) from exc

    def close(self, reason: str = "closed by the plugin") -> None:
        """Closes the trunk (idempotent) and waits for the reader thread to finish."""
        self._shutdown(reason)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(JOIN_TIMEOUT)
            if reader.is_alive():
                log.warning("mux reader thread did not stop within %.1f s", JOIN_TIMEOUT)
        if reader is None:
            self._release_socket()

    def _shutdown(self, reason: str) -> None:
        """Records the first reason and wakes the reader; the reader then tells the sinks."""
        with self._state_lock:
            if self._closed.is_set():
                return
            self._reason = reason
            self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected: the reader sees EOF either way

    def _release_socket(self) -> None:
        with self._write_lock:
            self._sock.close()

    def _read_loop(self) -> None:
        try:
            self._read_frames()
            self._shutdown("the runtime closed the connection")
        except ProtocolError as exc:
            self._shutdown(f"protocol error: {exc}")
        except ConnectionClosed:
            pass  # closed locally while reading; the reason is already set
        except OSError as exc:
            self._shutdown(f"reading from the runtime failed: {_describe_os_error(exc)}")
        except Exception as exc:  # a sink bug must close the session, not leave it hanging
            log.exception("mux reader failed")
            self._shutdown(f"internal error while reading: {type(exc).__name__}: {exc}")
        finally:
            self._notify_sinks()
            self._release_socket()

    def _read_frames(self) -> None:
        reader = _SocketReader(self._sock, self._closed)
        while True:
            header = reader.read_exact(FRAME_HEADER.size)
            if not header:
                return
            if len(header) < FRAME_HEADER.size:
                raise ProtocolError(f"connection ended inside a frame header ({len(header)} of 8 bytes)")
            conn_id, length = FRAME_HEADER.unpack(header)
            if length > MAX_INCOMING_FRAME_PAYLOAD:
                raise ProtocolError(
                    f"frame of {length} bytes on connection {conn_id} exceeds the 16 MiB frame limit"
                )
            payload = reader.read_exact(length)
            if len(payload) < length:
                raise ProtocolError(
                    f"connection ended inside a frame on connection {conn_id} "
                    f"({len(payload)} of {length} payload bytes)"
                )
            sink = self._sinks.get(conn_id)
            if sink is None:
                # The Go mux drops frames for connections nobody opened; so do we.
                log.debug("dropping %d-byte frame for unknown connection %d", length, conn_id)
            elif payload:
                sink.feed(payload)

    def _notify_sinks(self) -> None:
        for conn_id, sink in self._sinks.items():
            try:
                sink.connection_lost(self._reason)
            except Exception:
                log.exception("connection %d failed to handle the close", conn_id)


class _SocketReader:
    """Buffered exact reads from a socket whose receive timeout only means "nothing yet"."""

    def __init__(self, sock: socket.socket, closed: threading.Event) -> None:
        self._sock = sock
        self._closed = closed
        self._buffer = bytearray()

    def read_exact(self, size: int) -> bytes:
        """Returns ``size`` bytes, or fewer only when the stream ended first."""
        while len(self._buffer) < size:
            chunk = self._recv(max(_RECV_CHUNK, min(size - len(self._buffer), 1 << 20)))
            if not chunk:
                break
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _recv(self, size: int) -> bytes:
        while True:
            if self._closed.is_set():
                raise ConnectionClosed("closed")
            try:
                return self._sock.recv(size)
            except TimeoutError:
                continue


def encode_frames(conn_id: int, data: bytes) -> bytes:
    """The frames that carry ``data`` on ``conn_id``, each payload at most 4096 bytes."""
    step = MAX_OUTGOING_FRAME_PAYLOAD
    parts = []
    for start in range(0, len(data), step):
        chunk = data[start : start + step]
        parts.append(FRAME_HEADER.pack(conn_id, len(chunk)))
        parts.append(chunk)
    return b"".join(parts)


def _describe_os_error(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
