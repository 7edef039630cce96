"""Which thread runs which handler: the container events and Synchronize on the mux reader (no
hand-off on the path of a container start), Configure on a worker; and a handler on the reader
still cannot call UpdateContainers (it would wait for the reader it blocks)."""

from __future__ import annotations

import socket
import threading

import pytest

from nri_numa.nri.pb import api_pb2
from nri_numa.nri.session import NriSession
from tests.integration.nri.fake_runtime import CallFailed, FakeRuntime
from tests.integration.nri.test_session import DEADLINE, Handlers, Running, nri_threads


class ThreadRecorder(Handlers):
    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, str] = {}

    def configure(self, req):
        self.threads["configure"] = threading.current_thread().name
        return super().configure(req)

    def synchronize(self, req):
        self.threads["synchronize"] = threading.current_thread().name
        return super().synchronize(req)

    def stop_container(self, req):
        self.threads["stop_container"] = threading.current_thread().name
        return super().stop_container(req)


def test_events_run_on_the_reader_and_cannot_call_update_containers() -> None:
    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end, configure_first=True).start()
    handlers = ThreadRecorder()
    running = Running(NriSession(plugin_end), handlers)

    def create(req):
        handlers.threads["create_container"] = threading.current_thread().name
        running.session.update_containers([api_pb2.ContainerUpdate(container_id="other")])
        return api_pb2.CreateContainerResponse()

    handlers.on_create = create
    try:
        assert runtime.registered.wait(DEADLINE)
        runtime.synchronize()
        pod = api_pb2.PodSandbox(id="p1", name="web", uid="u1", namespace="default")
        container = api_pb2.Container(id="c1", pod_sandbox_id="p1", name="app")
        with pytest.raises(CallFailed, match="from inside a handler"):
            runtime.call("CreateContainer", api_pb2.CreateContainerRequest(pod=pod, container=container),
                         api_pb2.CreateContainerResponse)
        runtime.call("StopContainer", api_pb2.StopContainerRequest(pod=pod, container=container),
                     api_pb2.StopContainerResponse)
    finally:
        running.session.close()
        running.result()
        runtime.close()
    assert handlers.threads["configure"].startswith("nri-ttrpc-1-")
    assert {handlers.threads[m] for m in ("synchronize", "create_container", "stop_container")} == {
        "nri-mux-reader"}
    assert not [r for r in runtime.received.requests if r.method == "UpdateContainers"]
    assert nri_threads() == []
