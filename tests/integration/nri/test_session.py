"""NriSession against a fake runtime over real unix sockets: registration, events, errors, teardown."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_numa.nri import session as session_module
from nri_numa.nri.pb import api_pb2, ttrpc_pb2
from nri_numa.nri.session import NriSession, PluginError, SessionClosed
from nri_numa.nri.wire.ttrpc_message import Code, TtrpcError
from tests.integration.nri.fake_runtime import FRAME, CallFailed, FakeRuntime, byte_split

# docs/nri-protocol.md §4: RegisterPlugin{"proto", "10"} with a 5 s deadline, as captured against containerd.
REGISTER_PROTO_10 = bytes.fromhex(
    "000000020000004b000000410000000101000a1c6e72692e706b672e6170692e7631616c706861312e52756e74696d65"
    "120e5265676973746572506c7567696e1a0b0a0570726f746f120231302080e497d012"
)
# docs/nri-protocol.md §4: the plugin's Configure reply, status OK and events 0x7ff.
CONFIGURE_REPLY_7FF = bytes.fromhex("00000001" "00000011" "00000007" "00000001" "0200" "0a00" "1203" "10ff0f")
DEADLINE = 3.0


class Handlers:
    """A plugin that records what it is asked and answers from settable callables."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.events = 0x7FF
        self.on_create: Callable[[api_pb2.CreateContainerRequest], api_pb2.CreateContainerResponse] = (
            lambda req: api_pb2.CreateContainerResponse()
        )
        self.on_sync: Callable[[api_pb2.SynchronizeRequest], object] = lambda req: api_pb2.SynchronizeResponse()

    def configure(self, req):
        self.calls.append(("configure", req))
        return api_pb2.ConfigureResponse(events=self.events)

    def synchronize(self, req):
        self.calls.append(("synchronize", req))
        return self.on_sync(req)

    def create_container(self, req):
        self.calls.append(("create_container", req))
        return self.on_create(req)

    def update_container(self, req):
        self.calls.append(("update_container", req))
        return api_pb2.UpdateContainerResponse()

    def stop_container(self, req):
        self.calls.append(("stop_container", req))
        return api_pb2.StopContainerResponse()

    def state_change(self, req):
        self.calls.append(("state_change", req))

    def shutdown(self):
        self.calls.append(("shutdown", None))


class Running:
    """A session's run() on its own thread, with the outcome kept."""

    def __init__(self, session: NriSession, handlers: Handlers, name: str = "proto", index: str = "10") -> None:
        self.session = session
        self.outcome: list[BaseException | None] = []
        self.thread = threading.Thread(target=self._run, args=(handlers, name, index), name="test-run")
        self.thread.start()

    def _run(self, handlers: Handlers, name: str, index: str) -> None:
        try:
            self.session.run(handlers, name, index)
            self.outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - kept for the assertion
            self.outcome.append(exc)

    def result(self, timeout: float = DEADLINE) -> BaseException | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run() did not return"
        return self.outcome[0]


def nri_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nri-") and t.is_alive()]


@pytest.fixture
def started(request) -> Iterator[Callable[..., tuple[FakeRuntime, Running, Handlers]]]:
    """Starts a fake runtime and a session on a socketpair, and checks nothing leaks afterwards."""
    made: list[tuple[FakeRuntime, Running, socket.socket]] = []

    def start(handlers: Handlers | None = None, *, register: bool = True, **runtime_options):
        plugin_end, runtime_end = socket.socketpair()
        runtime = FakeRuntime(runtime_end, **runtime_options).start()
        handlers = handlers or Handlers()
        running = Running(NriSession(plugin_end), handlers)
        made.append((runtime, running, plugin_end))
        if register:
            assert runtime.registered.wait(DEADLINE)
        return runtime, running, handlers

    yield start
    for runtime, running, plugin_end in made:
        running.session.close()
        running.result()
        runtime.close()
        assert plugin_end.fileno() == -1, "the session left its socket open"
    assert nri_threads() == []


def test_registration_frame_is_byte_exact_and_configure_reply_too(started) -> None:
    runtime, _, handlers = started()
    assert bytes(runtime.received.raw[: len(REGISTER_PROTO_10)]) == REGISTER_PROTO_10
    assert runtime.configure() == api_pb2.ConfigureResponse(events=0x7FF)
    assert CONFIGURE_REPLY_7FF in bytes(runtime.received.raw)
    assert handlers.calls[0][1].runtime_version == "1.7.24~ds1"


@pytest.mark.parametrize("run", range(4))
def test_configure_may_arrive_before_the_registration_reply(started, run: int) -> None:
    runtime, _, handlers = started(configure_first=True)
    assert runtime.configure_reply == api_pb2.ConfigureResponse(events=0x7FF)
    assert [name for name, _ in handlers.calls] == ["configure"]
    assert runtime.synchronize() == api_pb2.SynchronizeResponse()


def test_full_event_sequence_over_a_real_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    session = NriSession.connect(path)
    runtime = FakeRuntime(listener.accept()[0]).start()
    handlers = Handlers()
    handlers.on_create = lambda req: api_pb2.CreateContainerResponse(
        adjust=api_pb2.ContainerAdjustment(
            linux=api_pb2.LinuxContainerAdjustment(
                resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="2-3", mems="0"))
            )
        )
    )
    running = Running(session, handlers)
    try:
        assert runtime.registered.wait(DEADLINE)
        runtime.configure()
        pod = api_pb2.PodSandbox(id="p1", name="web", uid="u1", namespace="default")
        container = api_pb2.Container(id="c1", pod_sandbox_id="p1", name="app")
        runtime.synchronize(api_pb2.SynchronizeRequest(pods=[pod], containers=[container]))
        runtime.call("StateChange", api_pb2.StateChangeEvent(event=api_pb2.RUN_POD_SANDBOX, pod=pod), api_pb2.Empty)
        reply = runtime.call(
            "CreateContainer", api_pb2.CreateContainerRequest(pod=pod, container=container),
            api_pb2.CreateContainerResponse,
        )
        assert reply.adjust.linux.resources.cpu.cpus == "2-3"
        runtime.call("UpdateContainer", api_pb2.UpdateContainerRequest(pod=pod, container=container),
                     api_pb2.UpdateContainerResponse)
        runtime.call("StopContainer", api_pb2.StopContainerRequest(pod=pod, container=container),
                     api_pb2.StopContainerResponse)
        runtime.call("Shutdown", api_pb2.Empty(), api_pb2.Empty)
        assert [name for name, _ in handlers.calls] == [
            "configure", "synchronize", "state_change", "create_container",
            "update_container", "stop_container", "shutdown",
        ]
        assert handlers.calls[1][1].containers[0].id == "c1"
        assert handlers.calls[2][1].event == api_pb2.RUN_POD_SANDBOX
        assert all(length <= 4096 for _, length in runtime.received.frames)
    finally:
        runtime.close()
        listener.close()
    outcome = running.result()
    assert isinstance(outcome, SessionClosed) and outcome.reason == "the runtime closed the connection"
    assert nri_threads() == []


def test_large_replies_leave_in_4096_byte_frames(started) -> None:
    handlers = Handlers()
    env = [api_pb2.KeyValue(key=f"K{i}", value="v" * 200) for i in range(500)]  # ~100 kB
    handlers.on_create = lambda req: api_pb2.CreateContainerResponse(adjust=api_pb2.ContainerAdjustment(env=env))
    runtime, _, _ = started(handlers)
    reply = runtime.call("CreateContainer", api_pb2.CreateContainerRequest(), api_pb2.CreateContainerResponse)
    assert list(reply.adjust.env) == env
    conn1_frames = [length for conn, length in runtime.received.frames if conn == 1]
    assert len(conn1_frames) > 20 and max(conn1_frames) == 4096


@pytest.mark.parametrize("split", [None, byte_split], ids=["go-framing", "one-byte-frames"])
def test_large_requests_in_any_framing_are_reassembled(started, split) -> None:
    runtime, _, handlers = started(split=split)
    count = 2000 if split is None else 50
    containers = [api_pb2.Container(id=f"c{i}", name="x" * 100) for i in range(count)]
    runtime.synchronize(api_pb2.SynchronizeRequest(containers=containers))
    assert list(handlers.calls[-1][1].containers) == containers


def test_interleaved_and_empty_frames_between_connections(started) -> None:
    runtime, running, handlers = started()
    body = api_pb2.StateChangeEvent(event=api_pb2.START_CONTAINER).SerializeToString()
    request = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method="StateChange", payload=body)
    message = struct.pack(">IIBB", len(request.SerializeToString()), 101, 1, 0) + request.SerializeToString()
    wire = b""
    for i, byte in enumerate(message):
        wire += FRAME.pack(1, 1) + bytes([byte]) + FRAME.pack(2, 0) + FRAME.pack(7, 2) + b"??"
        if i % 5 == 0:
            wire += FRAME.pack(1, 0)
    runtime.send_raw(wire)
    assert runtime.wait_response(101).status.code == 0
    assert handlers.calls[-1] == ("state_change", api_pb2.StateChangeEvent(event=api_pb2.START_CONTAINER))
    assert running.thread.is_alive()


def test_plugin_error_reaches_the_runtime_and_the_session_carries_on(started) -> None:
    handlers = Handlers()

    def refuse(req):
        raise PluginError("no NUMA node has 8 free CPUs (free: node0=2, node1=3)")

    handlers.on_create = refuse
    runtime, running, _ = started(handlers)
    with pytest.raises(CallFailed) as raised:
        runtime.call("CreateContainer", api_pb2.CreateContainerRequest(), api_pb2.CreateContainerResponse)
    assert (raised.value.code, raised.value.message) == (2, "no NUMA node has 8 free CPUs (free: node0=2, node1=3)")
    handlers.on_create = lambda req: 1 / 0
    with pytest.raises(CallFailed) as crashed:
        runtime.call("CreateContainer", api_pb2.CreateContainerRequest(), api_pb2.CreateContainerResponse)
    assert (crashed.value.code, crashed.value.message) == (2, "CreateContainer failed: ZeroDivisionError: division by zero")
    handlers.on_create = lambda req: None
    with pytest.raises(CallFailed) as wrong:
        runtime.call("CreateContainer", api_pb2.CreateContainerRequest(), api_pb2.CreateContainerResponse)
    assert wrong.value.message == "CreateContainer handler returned NoneType, expected CreateContainerResponse"
    assert runtime.synchronize() == api_pb2.SynchronizeResponse()
    assert running.thread.is_alive()


def test_configure_with_unknown_event_bits_is_refused_and_remembered(started) -> None:
    handlers = Handlers()
    handlers.events = 0x800
    runtime, running, _ = started(handlers)
    with pytest.raises(CallFailed) as raised:
        runtime.configure()
    assert raised.value.message.startswith("ConfigureResponse.events 0x800 has bits outside 0x7ff")
    runtime.close()  # what containerd does after a failed Configure
    outcome = running.result()
    assert isinstance(outcome, SessionClosed)
    assert outcome.reason.startswith("the runtime closed the connection (after Configure failed: ConfigureResponse")


def test_unknown_plugin_method_gets_unimplemented(started) -> None:
    runtime, running, _ = started()
    with pytest.raises(CallFailed) as raised:
        runtime.call("UpdatePodSandbox", api_pb2.Empty(), api_pb2.Empty)
    assert raised.value.code == Code.UNIMPLEMENTED
    assert runtime.synchronize() == api_pb2.SynchronizeResponse()


def test_malformed_event_payload_is_an_invalid_argument(started) -> None:
    runtime, _, handlers = started()
    request = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method="StateChange", payload=b"\x08")
    runtime.send_message(1, 201, 1, request.SerializeToString())
    status = runtime.wait_response(201).status
    assert status.code == Code.INVALID_ARGUMENT and status.message.startswith("malformed StateChange request")
    assert not any(name == "state_change" for name, _ in handlers.calls)


def test_update_containers_returns_the_failed_ones(started) -> None:
    def fail_unknown(request):
        return [u for u in request.update if u.container_id.startswith("gone")]

    runtime, running, _ = started(update_failures=fail_unknown)
    updates = [api_pb2.ContainerUpdate(container_id=cid) for cid in ("a", "gone-1", "b")]
    failed = running.session.update_containers(updates)
    assert [u.container_id for u in failed] == ["gone-1"]
    assert running.session.update_containers([]) == []


def test_update_containers_from_a_handler_is_refused(started) -> None:
    handlers = Handlers()
    refused: list[BaseException] = []

    def sync(req):
        try:
            running.session.update_containers([api_pb2.ContainerUpdate(container_id="x")])
        except RuntimeError as exc:
            refused.append(exc)
        return api_pb2.SynchronizeResponse()

    handlers.on_sync = sync
    runtime, running, _ = started(handlers)
    started_at = time.monotonic()
    assert runtime.synchronize() == api_pb2.SynchronizeResponse()
    assert time.monotonic() - started_at < 2.5  # answered, well before the runtime's 5 s timeout
    assert len(refused) == 1 and "from inside a handler" in str(refused[0])
    assert runtime.received.request_stream_ids == [1]  # nothing reached the runtime


def test_concurrent_update_containers_keep_stream_ids_odd_and_increasing(started) -> None:
    runtime, running, _ = started()

    def worker(n: int) -> None:
        for i in range(25):
            running.session.update_containers([api_pb2.ContainerUpdate(container_id=f"{n}-{i}")])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert runtime.received.request_stream_ids == list(range(1, 402, 2))
    assert len(runtime.received.requests) == 201


def test_update_containers_keeps_its_deadline(started) -> None:
    runtime, running, _ = started(update_failures=lambda req: time.sleep(2.0) or [])
    started_at = time.monotonic()
    with pytest.raises(TtrpcError) as raised:
        running.session.update_containers([], timeout=0.2)
    assert raised.value.code == Code.DEADLINE_EXCEEDED
    assert time.monotonic() - started_at < 1.5


def test_update_containers_before_registration_and_after_close(started) -> None:
    plugin_end, runtime_end = socket.socketpair()
    session = NriSession(plugin_end)
    with pytest.raises(RuntimeError, match="needs a running session"):
        session.update_containers([])
    session.close()
    runtime_end.close()
    runtime, running, _ = started()
    running.session.close()
    assert running.result() is None
    with pytest.raises(SessionClosed):
        running.session.update_containers([])


def test_close_from_another_thread_makes_run_return(started) -> None:
    runtime, running, _ = started()
    running.session.close()
    assert running.result() is None
    assert runtime.eof.wait(DEADLINE)


def test_close_from_inside_a_handler_makes_run_return(started) -> None:
    handlers = Handlers()

    def close_now(req):
        running.session.close()
        return api_pb2.SynchronizeResponse()

    handlers.on_sync = close_now
    runtime, running, _ = started(handlers)
    with pytest.raises(ConnectionError, match="closed the connection before answering Synchronize"):
        runtime.synchronize()
    assert running.result() is None


def test_run_twice_and_close_before_run(started) -> None:
    runtime, running, handlers = started()
    with pytest.raises(RuntimeError, match="only once"):
        running.session.run(handlers, "proto", "10")
    plugin_end, runtime_end = socket.socketpair()
    session = NriSession(plugin_end)
    session.close()
    session.run(Handlers(), "proto", "10")  # returns at once
    assert plugin_end.fileno() == -1
    runtime_end.close()


def test_rejected_registration_closes_the_session(started) -> None:
    runtime, running, _ = started(register=False, register_error='invalid plugin index "10", must be 2 digits')
    outcome = running.result()
    assert isinstance(outcome, SessionClosed)
    assert outcome.reason == (
        'registration as 10-proto failed: UNKNOWN (code 2): invalid plugin index "10", must be 2 digits'
    )
    assert runtime.eof.wait(DEADLINE)


def test_unanswered_registration_times_out(started, monkeypatch) -> None:
    monkeypatch.setattr(session_module, "REGISTRATION_TIMEOUT", 0.3)
    plugin_end, runtime_end = socket.socketpair()  # nobody answers on runtime_end
    running = Running(NriSession(plugin_end), Handlers())
    outcome = running.result()
    assert isinstance(outcome, SessionClosed)
    assert "no response to nri.pkg.api.v1alpha1.Runtime/RegisterPlugin (stream 1) within 0.3 s" in outcome.reason
    runtime_end.close()
    assert nri_threads() == []


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (FRAME.pack(1, 0xFFFFFFFF), "protocol error: frame of 4294967295 bytes on connection 1 exceeds the 16 MiB"),
        (FRAME.pack(2, 1 << 24 | 1), "protocol error: frame of 16777217 bytes on connection 2 exceeds the 16 MiB"),
        (FRAME.pack(1, 50) + b"short", "protocol error: connection ended inside a frame on connection 1 (5 of 50"),
        (b"\x00\x00\x00\x01\x00", "protocol error: connection ended inside a frame header (5 of 8 bytes)"),
    ],
    ids=["max-length", "just-over-16MiB", "truncated-payload", "truncated-header"],
)
def test_garbage_from_the_runtime_ends_run_with_the_reason(started, garbage: bytes, reason: str) -> None:
    runtime, running, _ = started()
    runtime.send_raw(garbage)
    runtime.sock.shutdown(socket.SHUT_WR)
    outcome = running.result()
    assert isinstance(outcome, SessionClosed) and outcome.reason.startswith(reason)


def test_oversized_ttrpc_message_is_refused_and_the_session_survives(started) -> None:
    runtime, running, _ = started()
    runtime.send_message(1, 301, 1, b"\0" * ((4 << 20) + 1))
    assert runtime.wait_response(301).status.code == Code.RESOURCE_EXHAUSTED
    assert runtime.synchronize() == api_pb2.SynchronizeResponse()


def test_response_on_an_unknown_stream_is_ignored(started) -> None:
    runtime, running, _ = started()
    runtime.send_message(2, 999, 2, b"")
    runtime.send_message(2, 1, 2, b"")  # a second answer to the finished RegisterPlugin
    assert running.session.update_containers([]) == []
    assert running.thread.is_alive()


@pytest.mark.parametrize(
    ("name", "index", "message"),
    [
        ("proto", "1", "invalid plugin index '1'"),
        ("proto", "ab", "invalid plugin index 'ab'"),
        ("proto", "\u0661\u0662", "exactly two ASCII digits"),
        ("proto", "100", "invalid plugin index '100'"),
        ("", "10", "invalid plugin name ''"),
    ],
)
def test_name_and_index_are_validated_before_any_io(name: str, index: str, message: str) -> None:
    plugin_end, runtime_end = socket.socketpair()
    session = NriSession(plugin_end)
    with pytest.raises(ValueError, match=message):
        session.run(Handlers(), name, index)
    runtime_end.settimeout(0.1)
    with pytest.raises(TimeoutError):
        runtime_end.recv(1)  # nothing was sent
    session.close()
    runtime_end.close()


def test_connect_to_a_missing_socket_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConnectionError, match=r"cannot connect to the NRI socket .*nri.sock: No such file.*enabled"):
        NriSession.connect(str(tmp_path / "nri.sock"), timeout=0.5)


def test_from_fd_adopts_a_socketpair_end_like_a_launched_plugin() -> None:
    plugin_end, runtime_end = socket.socketpair()
    session = NriSession.from_fd(os.dup(plugin_end.fileno()))
    plugin_end.close()
    runtime = FakeRuntime(runtime_end).start()
    running = Running(session, Handlers(), name="ignored-name", index="99")
    assert runtime.registered.wait(DEADLINE)
    assert runtime.registration == api_pb2.RegisterPluginRequest(plugin_name="ignored-name", plugin_idx="99")
    runtime.close()
    assert isinstance(running.result(), SessionClosed)


def test_from_fd_refuses_what_is_not_a_unix_stream_socket() -> None:
    read_end, write_end = os.pipe()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match=f"fd {read_end} is not an open socket"):
            NriSession.from_fd(read_end)
        with pytest.raises(ValueError, match="is a AF_INET/SOCK_DGRAM socket, expected an AF_UNIX stream socket"):
            NriSession.from_fd(udp.fileno())
        assert udp.fileno() >= 0  # refused, not closed
    finally:
        os.close(read_end)
        os.close(write_end)
        udp.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payloads=st.lists(st.tuples(st.sampled_from([1, 2, 9]), st.binary(max_size=64)), max_size=6),
    trailing=st.binary(max_size=24),
)
def test_random_bytes_after_registration_end_cleanly(started, payloads, trailing) -> None:
    """Framed garbage reaches ttrpc on both connections; whatever it is, run() ends with a reason."""
    runtime, running, _ = started()
    runtime.send_raw(b"".join(FRAME.pack(conn, len(data)) + data for conn, data in payloads) + trailing)
    runtime.sock.shutdown(socket.SHUT_WR)
    outcome = running.result()
    assert isinstance(outcome, SessionClosed) and outcome.reason
