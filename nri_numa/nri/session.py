"""One NRI plugin session with a runtime: register, serve the runtime's calls, send updates.

Mux connection 1 carries the runtime's calls to the plugin (we serve), connection 2 the plugin's
calls to the runtime (we are the client). Connection 1 is served from the moment the session
starts, because containerd may send Configure before it answers RegisterPlugin.

The container events and Synchronize run on the mux reader thread, Configure and Shutdown on
worker threads (docs/nri-wire-layer.md). A handler that raises never stops the session, it turns
into an error status (code 2) for that one call. The runtime waits at most 2 s for each answer.
A Synchronize the runtime split into parts (NRI v0.8+) reaches the plugin once, whole.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from nri_numa.nri.pb import api_pb2, ttrpc_pb2
from nri_numa.nri.wire.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, ConnectionClosed, Mux
from nri_numa.nri.wire.ttrpc import Client, RawHandler, Server
from nri_numa.nri.wire.ttrpc_message import Code, TtrpcError
from nri_numa.safeio.bounds import one_line

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0  # the runtime's own registration deadline
REQUEST_TIMEOUT = 2.0  # the runtime's default plugin_request_timeout
ALL_EVENTS = 0x7FF  # bits 1 << (Event - 1) for RUN_POD_SANDBOX .. REMOVE_CONTAINER
STOP_TIMEOUT = 2.0
_PLUGIN_INDEX = re.compile(r"[0-9]{2}")
# Run on the mux reader, not a worker: the container events, which are on the path of every
# container start and for which a hand-off to a worker thread cost as much as the wire itself,
# and Synchronize, whose parts must be gathered in order. The runtime sends them one at a time
# and waits for each answer. No handler can wait on the reader: update_containers() refuses to
# run inside one. Configure and Shutdown keep the worker pool.
INLINE_METHODS = frozenset((PLUGIN_SERVICE, method) for method in (
    "Synchronize", "CreateContainer", "UpdateContainer", "StopContainer", "StateChange"))


class PluginError(Exception):
    """Raised by a handler: becomes a ttrpc error status (code 2) whose message the runtime shows."""


class SessionClosed(Exception):
    """The runtime closed the connection, or the session broke; .reason says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PluginHandlers(Protocol):
    """What the plugin implements. Calls come one at a time from the runtime, on the session's
    threads (the reader, or a worker); each must answer well inside 2 s and must not wait for
    anything from the runtime."""

    def configure(self, req: api_pb2.ConfigureRequest) -> api_pb2.ConfigureResponse: ...

    def synchronize(self, req: api_pb2.SynchronizeRequest) -> api_pb2.SynchronizeResponse: ...

    def create_container(self, req: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerResponse: ...

    def update_container(self, req: api_pb2.UpdateContainerRequest) -> api_pb2.UpdateContainerResponse: ...

    def stop_container(self, req: api_pb2.StopContainerRequest) -> api_pb2.StopContainerResponse: ...

    def state_change(self, req: api_pb2.StateChangeEvent) -> None: ...

    def shutdown(self) -> None: ...


# Set while a handler runs on this thread: UpdateContainers from there would deadlock the runtime.
_in_handler = threading.local()

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


class NriSession:
    """A connected, not yet registered session. ``run()`` once, ``close()`` from anywhere."""

    def __init__(self, sock: socket.socket) -> None:
        self._mux = Mux(sock)
        # Reentrant: close() may run in a signal handler that interrupted run() holding this lock.
        self._lock = threading.RLock()
        self._started = False
        self._close_requested = False
        self._registered = False
        self._registration_settled = threading.Event()  # registered, refused or cut off
        self._client: Client | None = None
        self._server: Server | None = None
        self._configure_failure: str | None = None
        self._synchronized = False
        self._sync_parts: SplitSynchronize | None = None

    @classmethod
    def connect(cls, socket_path: str, timeout: float = 5.0) -> NriSession:
        """Connects to the runtime's NRI socket (external plugin). Raises ConnectionError."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            sock.close()
            raise ConnectionError(_connect_failure(socket_path, exc)) from exc
        return cls(sock)

    @classmethod
    def from_fd(cls, fd: int) -> NriSession:
        """Adopts the socket the runtime handed a plugin it launched (NRI_PLUGIN_SOCKET, fd 3)."""
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ValueError(f"fd {fd} is not an open socket: {exc.strerror or exc}") from exc
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            kind = f"{sock.family.name}/{sock.type.name}"
            sock.detach()  # not ours to close: we refuse it
            raise ValueError(f"fd {fd} is a {kind} socket, expected an AF_UNIX stream socket")
        return cls(sock)

    def run(self, handlers: PluginHandlers, name: str, index: str) -> None:
        """Serve conn 1 first, then RegisterPlugin on conn 2; block until the runtime closes the
        connection (raise SessionClosed with the reason) or close() is called (return).
        Validates name/index (two ASCII digits) with a clear ValueError."""
        _validate_identity(name, index)
        with self._lock:
            if self._started:
                raise RuntimeError("NriSession.run() can be called only once; connect a new session")
            self._started = True
            if self._close_requested:
                return
            self._server = Server(self._mux, PLUGIN_SERVICE_CONN, self._plugin_methods(handlers),
                                  after_reply=self._after_reply, inline=INLINE_METHODS)
            self._client = Client(self._mux, RUNTIME_SERVICE_CONN)
            self._mux.attach(PLUGIN_SERVICE_CONN, self._server)
            self._mux.attach(RUNTIME_SERVICE_CONN, self._client)
            self._mux.start()
        try:
            self._register(self._client, name, index)
            self._mux.closed.wait()
        finally:
            self._teardown()
        if not self._close_requested:
            raise SessionClosed(self._closed_reason())

    @property
    def synchronized(self) -> bool:
        """The runtime has had our Synchronize answer in time: it took the plugin in."""
        return self._synchronized

    def update_containers(
        self,
        updates: Iterable[api_pb2.ContainerUpdate],
        evictions: Iterable[api_pb2.ContainerEviction] = (),
        *,
        timeout: float = REQUEST_TIMEOUT,
    ) -> list[api_pb2.ContainerUpdate]:
        """Unsolicited updates (conn 2); returns the failed ones. Refuses (RuntimeError) when called
        from inside a handler (the runtime deadlocks, docs/nri-protocol.md §6).

        While registration is still under way it waits for it, within the same ``timeout``.
        Raises TtrpcError when the runtime answers with an error or not within ``timeout``, and
        SessionClosed when the session is closed."""
        if getattr(_in_handler, "active", False):
            raise RuntimeError(
                "update_containers() called from inside a handler: the runtime holds its lock until "
                "the handler returns, so the call would deadlock; return the updates in the handler's "
                "response instead"
            )
        client = self._client
        if client is None:
            raise RuntimeError("update_containers() needs a running session: call run() first")
        self._wait_registered(timeout)
        request = api_pb2.UpdateContainersRequest(update=list(updates), evict=list(evictions))
        try:
            payload = client.call(RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), timeout)
        except ConnectionClosed as exc:
            raise SessionClosed(exc.reason) from exc
        return list(_parse(api_pb2.UpdateContainersResponse, payload, "UpdateContainers response").failed)

    def _wait_registered(self, timeout: float) -> None:
        if not self._registration_settled.wait(timeout):
            raise TtrpcError(Code.DEADLINE_EXCEEDED, f"the session did not register within {timeout:g} s")
        if not self._registered:
            raise SessionClosed(self._closed_reason())

    def close(self) -> None:
        """Closes the connection and stops the worker threads; run() then returns. Idempotent."""
        with self._lock:
            self._close_requested = True
        self._teardown()

    def _teardown(self) -> None:
        self._mux.close("closed by the plugin")
        if self._server is not None and not self._server.stop(STOP_TIMEOUT):
            log.warning("NRI handler threads still busy %.1f s after the session closed", STOP_TIMEOUT)

    def _register(self, client: Client, name: str, index: str) -> None:
        request = api_pb2.RegisterPluginRequest(plugin_name=name, plugin_idx=index)
        try:
            client.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), timeout=REGISTRATION_TIMEOUT)
            self._registered = True
            log.info("registered with the runtime as %s-%s", index, name)
        except ConnectionClosed:
            pass  # run() reports the mux's reason, or returns if close() was called
        except TtrpcError as exc:
            # The runtime keeps a rejected plugin's socket open; closing it is up to us.
            self._mux.close(f"registration as {index}-{name} failed: {exc}")
        finally:
            self._registration_settled.set()

    def _after_reply(self, request: ttrpc_pb2.Request, code: int, elapsed: float) -> None:
        # A runtime whose Synchronize failed or timed out keeps the connection open but never
        # adds the plugin, so no event would ever come (docs/nri-protocol.md §6). Closing is the
        # only way to be synchronized again: the daemon connects anew.
        if request.method != "Synchronize":
            return
        late = bool(request.timeout_nano) and elapsed * 1e9 > request.timeout_nano
        if code == Code.OK and not late:
            # Synchronize runs on the reader, so no later part can have arrived meanwhile.
            parts = self._sync_parts
            self._synchronized = parts is None or not parts.gathering
            return
        what = f"failed (code {code})" if code != Code.OK else f"took {elapsed:.3f} s, too late"
        self._mux.close(f"Synchronize {what}: the runtime would never send this plugin an "
                        "event on this connection")

    def _closed_reason(self) -> str:
        reason = self._mux.reason
        if self._configure_failure is not None:
            reason += f" (after Configure failed: {self._configure_failure})"
        return reason

    def _plugin_methods(self, handlers: PluginHandlers) -> dict[tuple[str, str], RawHandler]:
        self._sync_parts = SplitSynchronize(handlers.synchronize)
        table: list[tuple[str, type[Message], type[Message], Callable[[Any], Message]]] = [
            ("Configure", api_pb2.ConfigureRequest, api_pb2.ConfigureResponse, self._configure_with(handlers)),
            ("Synchronize", api_pb2.SynchronizeRequest, api_pb2.SynchronizeResponse, self._sync_parts),
            ("CreateContainer", api_pb2.CreateContainerRequest, api_pb2.CreateContainerResponse,
             handlers.create_container),
            ("UpdateContainer", api_pb2.UpdateContainerRequest, api_pb2.UpdateContainerResponse,
             handlers.update_container),
            ("StopContainer", api_pb2.StopContainerRequest, api_pb2.StopContainerResponse, handlers.stop_container),
            ("StateChange", api_pb2.StateChangeEvent, api_pb2.Empty, _returning_empty(handlers.state_change)),
            ("Shutdown", api_pb2.Empty, api_pb2.Empty, _returning_empty(lambda _req: handlers.shutdown())),
        ]
        return {
            (PLUGIN_SERVICE, method): _typed(method, request_type, response_type, handler)
            for method, request_type, response_type, handler in table
        }

    def _configure_with(
        self, handlers: PluginHandlers
    ) -> Callable[[api_pb2.ConfigureRequest], api_pb2.ConfigureResponse]:
        def configure(req: api_pb2.ConfigureRequest) -> api_pb2.ConfigureResponse:
            try:
                response = handlers.configure(req)
                if isinstance(response, api_pb2.ConfigureResponse) and not 0 <= response.events <= ALL_EVENTS:
                    raise PluginError(
                        f"ConfigureResponse.events {response.events:#x} has bits outside {ALL_EVENTS:#x}: "
                        "the runtime would reject the subscription"
                    )
            except Exception as exc:
                self._configure_failure = str(exc) or type(exc).__name__
                raise
            return response

        return configure


class SplitSynchronize:
    """Gathers a Synchronize that the runtime split (NRI v0.8+) and hands it to the plugin whole.

    A runtime whose pods and containers do not fit in one ttrpc message sends them in parts,
    ``more`` set on each but the last. Like upstream's stub, every part but the last is answered
    at once with ``more`` echoed and no updates (the runtime closes a plugin that answers one
    otherwise, or with updates), and the plugin's synchronize is called once, on the last part,
    with every part's pods and containers in the order they came.
    """

    def __init__(
        self, synchronize: Callable[[api_pb2.SynchronizeRequest], api_pb2.SynchronizeResponse]
    ) -> None:
        self._synchronize = synchronize
        self._lock = threading.Lock()
        self._gathered: api_pb2.SynchronizeRequest | None = None

    @property
    def gathering(self) -> bool:
        """Parts have come, the last has not."""
        return self._gathered is not None

    def __call__(self, part: api_pb2.SynchronizeRequest) -> api_pb2.SynchronizeResponse:
        with self._lock:
            if part.more:
                if self._gathered is None:
                    self._gathered = api_pb2.SynchronizeRequest()
                self._gathered.pods.extend(part.pods)
                self._gathered.containers.extend(part.containers)
                log.debug("Synchronize part: %d pods, %d containers, more to come",
                          len(part.pods), len(part.containers))
                return api_pb2.SynchronizeResponse(more=True)
            whole, self._gathered = self._gathered, None
        if whole is None:
            return self._synchronize(part)
        whole.pods.extend(part.pods)
        whole.containers.extend(part.containers)
        log.info("Synchronize came in parts: %d pods, %d containers in all",
                 len(whole.pods), len(whole.containers))
        return self._synchronize(whole)


def _typed(
    method: str, request_type: type[Req], response_type: type[Resp], handler: Callable[[Req], Resp]
) -> RawHandler:
    """Wraps a handler on messages into one on bytes, turning its failures into status errors."""

    def raw(payload: bytes) -> bytes:
        request = _parse(request_type, payload, f"{method} request")
        _in_handler.active = True
        try:
            response = handler(request)
        except PluginError as exc:
            # One line the runtime can show, however long or odd the values it names.
            message = one_line(str(exc))
            log.warning("%s refused: %s", method, message)
            raise TtrpcError(Code.UNKNOWN, message) from exc
        except Exception as exc:
            log.exception("%s handler failed", method)
            raise TtrpcError(Code.UNKNOWN, one_line(f"{method} failed: {type(exc).__name__}: "
                                                    f"{exc}")) from exc
        finally:
            _in_handler.active = False
        if not isinstance(response, response_type):
            raise TtrpcError(
                Code.UNKNOWN,
                f"{method} handler returned {type(response).__name__}, expected {response_type.__name__}",
            )
        return response.SerializeToString()

    return raw


def _returning_empty(handler: Callable[[Req], None]) -> Callable[[Req], api_pb2.Empty]:
    def call(request: Req) -> api_pb2.Empty:
        handler(request)
        return api_pb2.Empty()

    return call


def _parse(message_type: type[Req], payload: bytes, what: str) -> Req:
    try:
        return message_type.FromString(payload)
    except DecodeError as exc:
        raise TtrpcError(Code.INVALID_ARGUMENT, f"malformed {what}: {exc}") from exc


def _validate_identity(name: str, index: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"invalid plugin name {name!r}: it must be a non-empty string")
    if not isinstance(index, str) or not _PLUGIN_INDEX.fullmatch(index):
        raise ValueError(f"invalid plugin index {index!r}: it must be exactly two ASCII digits, e.g. '10'")


def _connect_failure(socket_path: str, exc: OSError) -> str:
    detail = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        detail += " (is NRI enabled in the runtime, and is this its socket_path?)"
    elif isinstance(exc, PermissionError):
        detail += " (the NRI socket is writable by root only)"
    return f"cannot connect to the NRI socket {socket_path}: {detail}"
