"""A runtime peer for benchmarks: the containerd side of one NRI connection, on one thread.

It listens on a unix socket, takes the plugin's connection, answers RegisterPlugin, sends
Configure and Synchronize, and then sends calls one at a time, timing each from the moment its
request frames are written to the moment its reply message is complete: what containerd's own
client sees. One thread and blocking reads, so no thread hand-off or lock of this side is in the
figure; a request the plugin makes meanwhile (UpdateContainers) is answered on the spot.

The framing is written here again, apart from nri_numa's wire code (and from the tests' fake
runtime, whose reader thread is built for tests, not for timing).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from nri_numa.nri.pb import api_pb2, ttrpc_pb2

FRAME = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
REQUEST, RESPONSE = 1, 2
TIMEOUT_NANO = 2_000_000_000  # containerd's plugin_request_timeout


class PeerError(Exception):
    """The plugin answered with an error, broke the protocol or went away."""


class WireRuntime:
    """``listen()``, start the plugin, ``accept()``, ``handshake()``, then ``call()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._streams: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self._next_stream = 1
        self.updates_answered = 0

    def accept(self, timeout: float) -> None:
        self._listener.settimeout(timeout)
        try:
            self._sock, _ = self._listener.accept()
        except TimeoutError:
            raise PeerError(f"no plugin connected to {self.path} within {timeout:g} s") from None
        finally:
            self._listener.close()
        self._sock.settimeout(timeout)

    def handshake(self, config: str = "") -> None:
        """RegisterPlugin (answered), then Configure and an empty Synchronize, as containerd."""
        conn, stream, kind, body = self._next_message()
        request = ttrpc_pb2.Request.FromString(body)
        if (conn, kind, request.method) != (2, REQUEST, "RegisterPlugin"):
            raise PeerError(f"expected RegisterPlugin, got {request.method!r} on connection {conn}")
        self._reply(stream, b"")
        self.call("Configure", api_pb2.ConfigureRequest(
            config=config, runtime_name="containerd", runtime_version="2.1.9").SerializeToString())
        self.call("Synchronize", api_pb2.SynchronizeRequest().SerializeToString())

    def call(self, method: str, payload: bytes) -> tuple[bytes, float]:
        """Sends one call on connection 1; returns the reply payload and the seconds from the
        request written to the reply read. PeerError for an error status."""
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        body = ttrpc_pb2.Request(service=PLUGIN, method=method, payload=payload,
                                 timeout_nano=TIMEOUT_NANO).SerializeToString()
        wire = frames(1, TTRPC.pack(len(body), stream, REQUEST, 0) + body)
        began = time.perf_counter()
        self._socket().sendall(wire)
        while True:
            conn, got, kind, reply = self._next_message()
            if conn == 1 and kind == RESPONSE and got == stream:
                elapsed = time.perf_counter() - began
                break
            if conn == 2 and kind == REQUEST:
                self._serve(got, reply)
                continue
            raise PeerError(f"unexpected message type {kind} on connection {conn}, stream {got}")
        response = ttrpc_pb2.Response.FromString(reply)
        if response.status.code:
            raise PeerError(f"{method}: code {response.status.code}: {response.status.message}")
        return response.payload, elapsed

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _serve(self, stream: int, body: bytes) -> None:
        request = ttrpc_pb2.Request.FromString(body)
        if request.method != "UpdateContainers":
            raise PeerError(f"the plugin called {request.method!r} after registering")
        self.updates_answered += 1
        self._reply(stream, api_pb2.UpdateContainersResponse().SerializeToString())

    def _reply(self, stream: int, payload: bytes) -> None:
        body = ttrpc_pb2.Response(payload=payload).SerializeToString()
        self._socket().sendall(frames(2, TTRPC.pack(len(body), stream, RESPONSE, 0) + body))

    def _next_message(self) -> tuple[int, int, int, bytes]:
        """(connection, stream, type, body) of the next complete ttrpc message."""
        while True:
            for conn, data in self._streams.items():
                if len(data) >= TTRPC.size:
                    length, stream, kind, _ = TTRPC.unpack_from(data)
                    if len(data) >= TTRPC.size + length:
                        body = bytes(data[TTRPC.size:TTRPC.size + length])
                        del data[:TTRPC.size + length]
                        return conn, stream, kind, body
            self._read_frame()

    def _read_frame(self) -> None:
        while len(self._buffer) < FRAME.size:
            self._recv()
        conn, length = FRAME.unpack_from(self._buffer)
        while len(self._buffer) < FRAME.size + length:
            self._recv()
        self._streams.setdefault(conn, bytearray()).extend(
            self._buffer[FRAME.size:FRAME.size + length])
        del self._buffer[:FRAME.size + length]

    def _recv(self) -> None:
        chunk = self._socket().recv(1 << 16)
        if not chunk:
            raise PeerError("the plugin closed the connection")
        self._buffer += chunk

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise PeerError("no plugin connected")
        return self._sock


def frames(conn: int, data: bytes) -> bytes:
    """A message as containerd's ttrpc reaches the mux: one frame when it fits in 4096 bytes,
    else 4096 bytes and then the rest (docs/nri-protocol.md §2.3)."""
    parts = [data] if len(data) <= 4096 else [data[:4096], data[4096:]]
    return b"".join(FRAME.pack(conn, len(p)) + p for p in parts)
