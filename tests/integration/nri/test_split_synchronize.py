"""A Synchronize split into parts (NRI v0.8+, ``more``), sent as real protobuf frames over a real
socketpair by the fake runtime, the way containerd 2.x splits a state too large for one message."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from nri_numa.nri.pb import api_pb2
from nri_numa.nri.session import NriSession, SessionClosed
from tests.integration.nri.fake_runtime import CallFailed, FakeRuntime
from tests.integration.nri.test_session import DEADLINE, Handlers, Running, nri_threads
from tests.polling import until

# Response{status: {}, payload: SynchronizeResponse{more: true}}: what upstream's stub answers
# to every part but the last.
PART_REPLY = bytes.fromhex("0a00" "1202" "1001")


def pods_and_containers(n: int) -> tuple[list[api_pb2.PodSandbox], list[api_pb2.Container]]:
    pods = [api_pb2.PodSandbox(id=f"p{i}", name=f"web-{i}", uid=f"u{i}", namespace="default")
            for i in range(n)]
    containers = [api_pb2.Container(id=f"c{i}", pod_sandbox_id=f"p{i}", name="app",
                                    env=[f"VAR_{k}=value-{i}-{k}" for k in range(40)])
                  for i in range(n)]
    return pods, containers


def parts(pods, containers, size: int) -> list[api_pb2.SynchronizeRequest]:
    """As containerd's adaptation cuts them: ``size`` pods and containers a part, ``more`` on
    all but the last."""
    count = max(len(pods), len(containers))
    cuts = list(range(0, count, size)) or [0]
    return [api_pb2.SynchronizeRequest(pods=pods[at:at + size], containers=containers[at:at + size],
                                       more=at + size < count) for at in cuts]


@pytest.fixture
def session() -> Iterator[tuple[FakeRuntime, Running, Handlers]]:
    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end).start()
    handlers = Handlers()
    handlers.on_sync = lambda req: api_pb2.SynchronizeResponse(update=[
        api_pb2.ContainerUpdate(container_id=c.id) for c in req.containers])
    running = Running(NriSession(plugin_end), handlers)
    assert runtime.registered.wait(DEADLINE)
    runtime.configure()
    yield runtime, running, handlers
    running.session.close()
    running.result()
    runtime.close()
    assert plugin_end.fileno() == -1
    assert nri_threads() == []


def test_parts_are_answered_at_once_and_the_plugin_sees_the_whole_state_once(session) -> None:
    runtime, running, handlers = session
    pods, containers = pods_and_containers(250)  # about 1 MB, each part over many frames
    requests = parts(pods, containers, 100)
    assert [r.more for r in requests] == [True, True, False]
    for part in requests[:-1]:
        reply = runtime.synchronize(part)
        assert reply.more and not reply.update
    # Parts run in order on the plugin's reader: the first part's answer is fully settled.
    assert not running.session.synchronized  # the runtime has not taken us in yet
    assert [name for name, _ in handlers.calls] == ["configure"]

    reply = runtime.synchronize(requests[-1])
    assert not reply.more
    assert [u.container_id for u in reply.update] == [c.id for c in containers]
    assert [name for name, _ in handlers.calls] == ["configure", "synchronize"]
    whole = handlers.calls[1][1]
    assert list(whole.pods) == pods and list(whole.containers) == containers
    assert not whole.more
    until(lambda: running.session.synchronized, DEADLINE, 0.005)  # set just after the answer
    assert max(length for conn, length in runtime.received.frames if conn == 1) <= 4096


def test_a_part_is_answered_with_exactly_the_stubs_bytes(session) -> None:
    runtime, _, _ = session
    pods, containers = pods_and_containers(2)
    runtime.synchronize(parts(pods, containers, 1)[0])
    assert runtime.received.responses[3].SerializeToString() == PART_REPLY  # stream 1 was Configure


def test_a_whole_synchronize_goes_straight_to_the_plugin(session) -> None:
    runtime, running, handlers = session
    pods, containers = pods_and_containers(3)
    reply = runtime.synchronize(api_pb2.SynchronizeRequest(pods=pods, containers=containers))
    assert not reply.more and len(reply.update) == 3
    assert list(handlers.calls[1][1].containers) == containers
    until(lambda: running.session.synchronized, DEADLINE, 0.005)  # set just after the answer


def test_a_failed_last_part_closes_the_session_and_nothing_is_left_over(session) -> None:
    runtime, running, handlers = session

    def refuse(req):
        raise RuntimeError(f"cannot take {len(req.containers)} containers")

    handlers.on_sync = refuse
    pods, containers = pods_and_containers(4)
    first, last = parts(pods, containers, 2)
    assert runtime.synchronize(first).more
    with pytest.raises(CallFailed, match="cannot take 4 containers"):
        runtime.synchronize(last)
    outcome = running.result()
    assert isinstance(outcome, SessionClosed) and "Synchronize failed" in outcome.reason
    assert not running.session.synchronized
