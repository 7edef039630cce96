"""A runtime side of the NRI protocol for tests and the benchmark, written apart from nri_numa's wire code.

It behaves like containerd 1.7 as docs/nri-protocol.md describes it: it answers RegisterPlugin
with a zero-length OK body, may send Configure before that answer, calls the plugin on connection 1
with odd stream ids, and answers UpdateContainers. It records every frame the plugin sends so tests
can check frame sizes and stream ids on the wire.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from nri_numa.nri.pb import api_pb2, ttrpc_pb2

FRAME = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"


class CallFailed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"code {code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Received:
    """What the plugin put on the wire, as the runtime saw it."""

    raw: bytearray = field(default_factory=bytearray)
    frames: list[tuple[int, int]] = field(default_factory=list)  # (conn id, payload length)
    request_stream_ids: list[int] = field(default_factory=list)  # plugin → runtime, conn 2
    requests: list[ttrpc_pb2.Request] = field(default_factory=list)
    responses: dict[int, ttrpc_pb2.Response] = field(default_factory=dict)  # conn-1 stream id → reply


class FakeRuntime:
    """The runtime end of a connected socket. Call ``start()``, then drive the plugin."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        configure_first: bool = False,
        register_error: str | None = None,
        update_failures: Callable[[api_pb2.UpdateContainersRequest], list[api_pb2.ContainerUpdate]] | None = None,
        split: Callable[[bytes], list[bytes]] | None = None,
    ) -> None:
        self.sock = sock
        self.configure_first = configure_first
        self.register_error = register_error
        self.update_failures = update_failures
        self.split = split or go_split
        self.received = Received()
        self.registration: api_pb2.RegisterPluginRequest | None = None
        self.registered = threading.Event()
        self.configure_reply: api_pb2.ConfigureResponse | None = None
        self.eof = threading.Event()
        self._write_lock = threading.Lock()
        self._buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self._waiters: dict[int, threading.Event] = {}
        self._next_stream = 1
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._read, name="fake-runtime", daemon=True)

    def start(self) -> FakeRuntime:
        self._thread.start()
        return self

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self.sock.close()

    # --- runtime → plugin calls on connection 1 ---------------------------------------------

    def call(self, method: str, request: Message, reply_type: type[Message], timeout: float = 5.0) -> Message:
        body = ttrpc_pb2.Request(
            service=PLUGIN, method=method, payload=request.SerializeToString(), timeout_nano=int(timeout * 1e9)
        ).SerializeToString()
        with self._lock:
            stream = self._next_stream
            self._next_stream += 2
            done = self._waiters[stream] = threading.Event()
            self.send_message(1, stream, 1, body)
        if not done.wait(timeout):
            raise TimeoutError(f"plugin did not answer {method} on stream {stream} within {timeout} s")
        if stream not in self.received.responses:
            raise ConnectionError(f"the plugin closed the connection before answering {method}")
        response = self.received.responses[stream]
        if response.status.code:
            raise CallFailed(response.status.code, response.status.message)
        return reply_type.FromString(response.payload)

    def configure(self, config: str = "") -> api_pb2.ConfigureResponse:
        request = api_pb2.ConfigureRequest(config=config, runtime_name="containerd", runtime_version="1.7.24~ds1")
        return self.call("Configure", request, api_pb2.ConfigureResponse)

    def synchronize(self, request: api_pb2.SynchronizeRequest | None = None) -> api_pb2.SynchronizeResponse:
        return self.call("Synchronize", request or api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse)

    def wait_response(self, stream: int, timeout: float = 5.0) -> ttrpc_pb2.Response:
        """The plugin's answer on conn 1 to a request sent by hand on ``stream``."""
        if not self._waiter(stream).wait(timeout):
            raise TimeoutError(f"plugin did not answer stream {stream} within {timeout} s")
        return self.received.responses[stream]

    def _waiter(self, stream: int) -> threading.Event:
        with self._lock:
            return self._waiters.setdefault(stream, threading.Event())

    # --- raw wire ---------------------------------------------------------------------------

    def send_message(self, conn: int, stream: int, kind: int, body: bytes) -> None:
        if conn == 1 and kind == 1:
            with self._lock:  # a request sent by hand moves the runtime's stream counter on too
                self._next_stream = max(self._next_stream, stream + 2)
        self.send_payload(conn, TTRPC.pack(len(body), stream, kind, 0) + body)

    def send_payload(self, conn: int, data: bytes) -> None:
        with self._write_lock:
            self.sock.sendall(b"".join(FRAME.pack(conn, len(c)) + c for c in self.split(data)))

    def send_raw(self, data: bytes) -> None:
        with self._write_lock:
            self.sock.sendall(data)

    # --- reading ----------------------------------------------------------------------------

    def _read(self) -> None:
        pending = bytearray()
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof.set()
                with self._lock:
                    for waiter in self._waiters.values():
                        waiter.set()
                return
            self.received.raw += chunk
            pending += chunk
            while len(pending) >= 8:
                conn, length = FRAME.unpack_from(pending)
                if len(pending) < 8 + length:
                    break
                self.received.frames.append((conn, length))
                self._buffers.setdefault(conn, bytearray()).extend(pending[8 : 8 + length])
                del pending[: 8 + length]
                self._cut_messages(conn)

    def _cut_messages(self, conn: int) -> None:
        buffer = self._buffers[conn]
        while len(buffer) >= 10:
            length, stream, kind, _flags = TTRPC.unpack_from(buffer)
            if len(buffer) < 10 + length:
                return
            body = bytes(buffer[10 : 10 + length])
            del buffer[: 10 + length]
            if conn == 2 and kind == 1:
                self.received.request_stream_ids.append(stream)
                self._serve(stream, ttrpc_pb2.Request.FromString(body))
            elif conn == 1 and kind == 2:
                self.received.responses[stream] = ttrpc_pb2.Response.FromString(body)
                self._waiter(stream).set()

    def _serve(self, stream: int, request: ttrpc_pb2.Request) -> None:
        self.received.requests.append(request)
        if request.method == "RegisterPlugin":
            self.registration = api_pb2.RegisterPluginRequest.FromString(request.payload)
            threading.Thread(target=self._answer_registration, args=(stream,), daemon=True).start()
        elif request.method == "UpdateContainers":
            update = api_pb2.UpdateContainersRequest.FromString(request.payload)
            threading.Thread(target=self._answer_update, args=(stream, update), daemon=True).start()
        else:
            status = ttrpc_pb2.Status(code=12, message=f"method {request.method}")
            self.send_message(2, stream, 2, ttrpc_pb2.Response(status=status).SerializeToString())

    def _answer_registration(self, stream: int) -> None:
        # Off the reader thread, like containerd: Configure's reply must be readable meanwhile.
        if self.register_error is not None:
            status = ttrpc_pb2.Status(code=2, message=self.register_error)
            self.send_message(2, stream, 2, ttrpc_pb2.Response(status=status).SerializeToString())
            return
        if self.configure_first:
            self.configure_reply = self.configure()
        self._reply(stream, b"")
        self.registered.set()

    def _answer_update(self, stream: int, request: api_pb2.UpdateContainersRequest) -> None:
        failed = self.update_failures(request) if self.update_failures else []
        try:
            self._reply(stream, api_pb2.UpdateContainersResponse(failed=failed).SerializeToString())
        except OSError:
            pass  # the plugin gave up and went away meanwhile

    def _reply(self, stream: int, payload: bytes) -> None:
        # containerd answers an OK call with an empty result as a zero-length body.
        body = ttrpc_pb2.Response(payload=payload).SerializeToString()
        self.send_message(2, stream, 2, body)


def go_split(data: bytes) -> list[bytes]:
    """How Go's ttrpc reaches the mux: one frame up to 4096 bytes, else 4096 and then the rest."""
    if len(data) <= 4096:
        return [data]
    return [data[:4096], data[4096:]]


def byte_split(data: bytes) -> list[bytes]:
    """The most hostile legal framing: one byte per frame."""
    return [data[i : i + 1] for i in range(len(data))]
