"""ttrpc, the RPC protocol NRI runs on each logical mux connection.

A message is a 10-byte header (body length u32, stream id u32, type u8, flags u8, big-endian) and
a protobuf body: a ``Request`` envelope from client to server, a ``Response`` back on the same
stream id. Clients number their streams 1, 3, 5, ...; containerd rejects an id that is even or not
larger than the last one, so a stream id is taken and its request written in one critical section.

``Client`` waits for responses by stream id with a deadline. ``Server`` runs handlers on a small
pool of worker threads, or on the mux reader for the methods it is told are quick, and turns
failures into ttrpc status codes.

The messages themselves (header, encoding, cutting a byte stream, status codes and the error
that carries one) are in ``ttrpc_message``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from nri_numa.nri.pb import ttrpc_pb2
from nri_numa.nri.wire.mux import ConnectionClosed, Mux
from nri_numa.nri.wire.ttrpc_message import (
    MAX_MESSAGE_SIZE,
    Code,
    Message,
    MessageDecoder,
    MessageType,
    TtrpcError,
    oversize_text,
    encode_message,
)

log = logging.getLogger(__name__)

MAX_STREAM_ID = 0xFFFFFFFF
DEFAULT_WORKERS = 4


@dataclass
class _Pending:
    done: threading.Event
    body: bytes | None = None
    error: BaseException | None = None


class Client:
    """The client side of one ttrpc connection: unary calls matched to responses by stream id."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self._mux = mux
        self._conn_id = conn_id
        self._decoder = MessageDecoder()
        self._send_lock = threading.Lock()  # stream id order on the wire == allocation order
        self._pending_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_stream_id = 1
        self._lost: str | None = None

    def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """Sends one request and returns the response payload.

        Raises TtrpcError for a non-OK status, a missed deadline or an oversized message, and
        ConnectionClosed when the connection is or goes down.
        """
        request = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9)
        )
        body = request.SerializeToString()
        if len(body) > MAX_MESSAGE_SIZE:
            raise TtrpcError(Code.RESOURCE_EXHAUSTED, oversize_text(len(body)))
        stream_id, pending = self._send_request(body)
        if not pending.done.wait(timeout):
            with self._pending_lock:
                self._pending.pop(stream_id, None)
            if not pending.done.is_set():
                raise TtrpcError(
                    Code.DEADLINE_EXCEEDED,
                    f"no response to {service}/{method} (stream {stream_id}) within {timeout:g} s",
                )
        if pending.error is not None:
            raise pending.error
        assert pending.body is not None
        return _response_payload(pending.body, f"{service}/{method}")

    def _send_request(self, body: bytes) -> tuple[int, _Pending]:
        with self._send_lock:
            stream_id = self._next_stream_id
            if stream_id > MAX_STREAM_ID:
                raise ConnectionClosed("ttrpc stream ids exhausted on this connection")
            pending = _Pending(threading.Event())
            with self._pending_lock:
                if self._lost is not None:
                    raise ConnectionClosed(self._lost)
                self._pending[stream_id] = pending
            self._next_stream_id += 2
            try:
                self._mux.send(self._conn_id, encode_message(stream_id, MessageType.REQUEST, body))
            except ConnectionClosed:
                with self._pending_lock:
                    self._pending.pop(stream_id, None)
                raise
        return stream_id, pending

    def feed(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            self._on_message(message)

    def _on_message(self, message: Message) -> None:
        header = message.header
        if header.type != MessageType.RESPONSE:
            log.warning("ignoring ttrpc message of type %d on a client connection", header.type)
            return
        with self._pending_lock:
            pending = self._pending.pop(header.stream_id, None)
        if pending is None:
            log.warning("dropping ttrpc response on inactive stream %d", header.stream_id)
            return
        if message.oversized:
            pending.error = TtrpcError(Code.RESOURCE_EXHAUSTED, oversize_text(header.length))
        else:
            pending.body = message.body
        pending.done.set()

    def connection_lost(self, reason: str) -> None:
        with self._pending_lock:
            self._lost = reason
            waiting, self._pending = self._pending, {}
        for pending in waiting.values():
            pending.error = ConnectionClosed(reason)
            pending.done.set()


RawHandler = Callable[[bytes], bytes]
"""A method implementation on serialized messages: request payload in, response payload out.
Raising TtrpcError picks the status code; any other exception becomes UNKNOWN (2)."""

AfterReply = Callable[[ttrpc_pb2.Request, int, float], None]
"""Told, once a handler's answer has been written, the request, the status code sent and the
seconds the handler took."""


class Server:
    """The server side of one ttrpc connection, dispatching to ``handlers[(service, method)]``."""

    def __init__(
        self,
        mux: Mux,
        conn_id: int,
        handlers: Mapping[tuple[str, str], RawHandler],
        workers: int = DEFAULT_WORKERS,
        after_reply: AfterReply | None = None,
        inline: Collection[tuple[str, str]] = (),
    ) -> None:
        self._mux = mux
        self._conn_id = conn_id
        self._handlers = dict(handlers)
        self._after_reply = after_reply
        # Methods run on the mux reader itself: no queue hop, no second thread waking up and
        # taking the GIL in turn. Only for handlers that answer quickly and never wait for
        # anything the reader would have to deliver (a response on connection 2).
        self._inline = frozenset(inline)
        self._services = {service for service, _ in self._handlers}
        self._decoder = MessageDecoder()
        self._last_stream_id = 0
        self._pool = _WorkerPool(workers, name=f"nri-ttrpc-{conn_id}")

    def feed(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            self._on_message(message)

    def connection_lost(self, reason: str) -> None:
        log.debug("ttrpc server on connection %d lost: %s", self._conn_id, reason)

    def stop(self, timeout: float) -> bool:
        """Stops the workers after their current calls; True when all ended within ``timeout``."""
        return self._pool.stop(timeout)

    def _on_message(self, message: Message) -> None:
        header = message.header
        if header.type != MessageType.REQUEST:
            log.warning("ignoring ttrpc message of type %d on a server connection", header.type)
            return
        refusal = self._refusal(message)
        if refusal is not None:
            self._respond_error(header.stream_id, refusal)
            return
        self._last_stream_id = header.stream_id
        try:
            request = ttrpc_pb2.Request.FromString(message.body)
        except DecodeError as exc:
            error = TtrpcError(Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            self._respond_error(header.stream_id, error)
            return
        if (request.service, request.method) in self._inline:
            try:
                self._serve(header.stream_id, request)
            except Exception:  # answered already; a bug after that must not stop the reader
                log.exception("ttrpc request on stream %d failed", header.stream_id)
        elif not self._pool.submit(self._serve, header.stream_id, request):
            log.debug("dropping request on stream %d: the server is stopping", header.stream_id)

    def _refusal(self, message: Message) -> TtrpcError | None:
        stream_id = message.header.stream_id
        if stream_id % 2 == 0:
            return TtrpcError(Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
        if stream_id <= self._last_stream_id:
            return TtrpcError(Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
        if message.oversized:
            return TtrpcError(Code.RESOURCE_EXHAUSTED, oversize_text(message.header.length))
        return None

    def _serve(self, stream_id: int, request: ttrpc_pb2.Request) -> None:
        handler = self._handlers.get((request.service, request.method))
        if handler is None:
            self._respond_error(stream_id, self._unimplemented(request.service, request.method))
            return
        started = time.monotonic()
        code = self._call(handler, request, stream_id)
        elapsed = time.monotonic() - started
        _warn_if_late(request, elapsed)
        if self._after_reply is not None:
            self._after_reply(request, code, elapsed)

    def _call(self, handler: RawHandler, request: ttrpc_pb2.Request, stream_id: int) -> int:
        """Runs the handler and writes its answer; returns the status code sent."""
        try:
            payload = handler(request.payload)
        except TtrpcError as exc:
            self._respond_error(stream_id, exc)
            return exc.code
        except Exception as exc:
            log.exception("handler for %s/%s failed", request.service, request.method)
            self._respond_error(stream_id, TtrpcError(Code.UNKNOWN, str(exc) or type(exc).__name__))
            return Code.UNKNOWN
        self._respond(stream_id, ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=Code.OK), payload=payload))
        return Code.OK

    def _unimplemented(self, service: str, method: str) -> TtrpcError:
        if service not in self._services:
            return TtrpcError(Code.UNIMPLEMENTED, f"service {service} is not served here")
        return TtrpcError(Code.UNIMPLEMENTED, f"method {service}/{method} is not implemented")

    def _respond_error(self, stream_id: int, error: TtrpcError) -> None:
        status = ttrpc_pb2.Status(code=error.code, message=error.message)
        self._respond(stream_id, ttrpc_pb2.Response(status=status))

    def _respond(self, stream_id: int, response: ttrpc_pb2.Response) -> None:
        body = response.SerializeToString()
        if len(body) > MAX_MESSAGE_SIZE:
            status = ttrpc_pb2.Status(code=Code.RESOURCE_EXHAUSTED, message=oversize_text(len(body)))
            body = ttrpc_pb2.Response(status=status).SerializeToString()
        try:
            self._mux.send(self._conn_id, encode_message(stream_id, MessageType.RESPONSE, body))
        except ConnectionClosed as exc:
            log.debug("response on stream %d not sent: %s", stream_id, exc.reason)


_Task = tuple[Callable[..., None], tuple[object, ...]]


class _WorkerPool:
    """A fixed set of daemon threads: a stuck handler can delay shutdown but never block exit."""

    def __init__(self, size: int, name: str) -> None:
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., None], *args: object) -> bool:
        with self._lock:
            if self._stopping:
                return False
            self._tasks.put((fn, args))
        return True

    def stop(self, timeout: float) -> bool:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                for _ in self._threads:
                    self._tasks.put(None)
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads if t is not current)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, args = task
            try:
                fn(*args)
            except Exception:  # fn answers its own errors; this only guards the thread
                log.exception("ttrpc worker task failed")


def _response_payload(body: bytes, call: str) -> bytes:
    try:
        response = ttrpc_pb2.Response.FromString(body)
    except DecodeError as exc:
        raise TtrpcError(Code.UNKNOWN, f"malformed response to {call}: {exc}") from exc
    if response.HasField("status") and response.status.code != Code.OK:
        raise TtrpcError(response.status.code, response.status.message)
    return response.payload


def _warn_if_late(request: ttrpc_pb2.Request, elapsed: float) -> None:
    if request.timeout_nano and elapsed * 1e9 > request.timeout_nano:
        log.warning(
            "%s/%s took %.3f s, past the caller's %.3f s deadline: the runtime has given up on it",
            request.service, request.method, elapsed, request.timeout_nano / 1e9,
        )
