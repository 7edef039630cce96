"""The fake device plugin over real gRPC on unix sockets: it registers with a small fake of the
kubelet's Registration service (played here by a gRPC server of the test on kubelet.sock), and
the test then calls it as the kubelet does: ListAndWatch, Allocate, GetPreferredAllocation,
PreStartContainer, GetDevicePluginOptions. A kubelet restart (the folder emptied, a new
kubelet.sock) makes it serve and register again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nri_numa.fake_device_plugin import API_VERSION, KUBELET_SOCKET_NAME
from nri_numa.fake_device_plugin.devices import FakeDevice, device_list
from nri_numa.fake_device_plugin.pb import api_pb2 as dp
from nri_numa.fake_device_plugin.pb import api_pb2_grpc as dp_grpc
from nri_numa.fake_device_plugin.plugin import FakeDevicePlugin, PluginCall, PluginError

REPO = Path(__file__).resolve().parents[3]
GPU = "example.com/gpu"
DEVICES = device_list(GPU, [FakeDevice("gpu0", (0,)), FakeDevice("gpu1", (1,)),
                            FakeDevice("gpu2", (), healthy=False)])
POLL_S = 0.05


class FakeRegistration(dp_grpc.RegistrationServicer):
    """The kubelet's side of registration: keeps each request; ``refuse`` makes it answer as
    a kubelet refusing the plugin does."""

    def __init__(self, folder: Path, refuse: str = "") -> None:
        self.requests: list[dp.RegisterRequest] = []
        self.arrived = threading.Semaphore(0)
        self.refuse = refuse
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        dp_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{folder / KUBELET_SOCKET_NAME}")
        self.server.start()

    def Register(self, request, context):  # noqa: ANN001, ANN201, N802
        self.requests.append(request)
        self.arrived.release()
        if self.refuse:
            context.abort(grpc.StatusCode.UNKNOWN, self.refuse)
        return dp.Empty()

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder (unix socket paths are limited to 108 bytes), removed after."""
    path = Path(tempfile.mkdtemp(prefix="nri-numa-dp-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(folder: Path) -> Iterator[FakeRegistration]:
    registration = FakeRegistration(folder)
    yield registration
    registration.stop()


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def plugin(folder: Path, kubelet: FakeRegistration, lines: list[str]) -> Iterator[FakeDevicePlugin]:
    with FakeDevicePlugin(DEVICES, plugin_dir=folder, poll_s=POLL_S, say=lines.append) as running:
        assert running.wait_registered(1, timeout_s=10), lines
        yield running


def plugin_stub(plugin: FakeDevicePlugin) -> tuple[grpc.Channel, dp_grpc.DevicePluginStub]:
    channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
    return channel, dp_grpc.DevicePluginStub(channel)


def as_tuples(reply: dp.ListAndWatchResponse) -> list[tuple[str, str, list[int]]]:
    return [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in reply.devices]


def test_it_registers_as_a_v1beta1_plugin_of_its_resource(
        plugin: FakeDevicePlugin, kubelet: FakeRegistration) -> None:
    (request,) = kubelet.requests
    assert request.version == API_VERSION == "v1beta1"
    assert request.resource_name == GPU
    assert request.endpoint == plugin.endpoint == "fake-example-com-gpu.sock"
    assert (plugin.socket_path.parent / request.endpoint).is_socket()
    assert request.options.pre_start_required and request.options.get_preferred_allocation_available


def test_list_and_watch_sends_the_devices_and_every_change(plugin: FakeDevicePlugin) -> None:
    channel, stub = plugin_stub(plugin)
    with channel:
        stream = stub.ListAndWatch(dp.Empty(), timeout=10)
        assert as_tuples(next(stream)) == [("gpu0", "Healthy", [0]), ("gpu1", "Healthy", [1]),
                                           ("gpu2", "Unhealthy", [])]
        plugin.set_devices(device_list(GPU, [FakeDevice("gpu0", (0,), healthy=False),
                                             FakeDevice("gpu1", (1,))]))
        assert as_tuples(next(stream)) == [("gpu0", "Unhealthy", [0]), ("gpu1", "Healthy", [1])]
        stream.cancel()
    assert not next(iter(plugin.devices.devices)).healthy


def test_allocate_gives_one_variable_per_device_and_refuses_unknown_ids(
        plugin: FakeDevicePlugin) -> None:
    channel, stub = plugin_stub(plugin)
    with channel:
        reply = stub.Allocate(dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devicesIDs=["gpu1", "gpu0"]),
            dp.ContainerAllocateRequest(devicesIDs=["gpu0"])]), timeout=5)
        assert [dict(c.envs) for c in reply.container_responses] == [
            {"FAKE_DEVICE_0": "gpu1", "FAKE_DEVICE_1": "gpu0"}, {"FAKE_DEVICE_0": "gpu0"}]
        assert not any(c.devices or c.mounts for c in reply.container_responses)  # no host device
        with pytest.raises(grpc.RpcError) as refused:
            stub.Allocate(dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devicesIDs=["gpu9"])]), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "unknown example.com/gpu device 'gpu9'"
    assert PluginCall("Allocate", ("gpu1", "gpu0")) in plugin.calls


def test_options_preferred_allocation_and_pre_start(plugin: FakeDevicePlugin,
                                                    lines: list[str]) -> None:
    channel, stub = plugin_stub(plugin)
    with channel:
        options = stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        assert options.pre_start_required and options.get_preferred_allocation_available
        preferred = stub.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=["gpu1", "gpu0"],
                                                   allocation_size=1),
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=["gpu0", "gpu1"],
                                                   must_include_deviceIDs=["gpu1"],
                                                   allocation_size=2)]), timeout=5)
        # The list's order wins; devices that must be included come first.
        assert [list(c.deviceIDs) for c in preferred.container_responses] == [["gpu0"],
                                                                              ["gpu1", "gpu0"]]
        stub.PreStartContainer(dp.PreStartContainerRequest(devicesIDs=["gpu0"]), timeout=5)
    assert PluginCall("PreStartContainer", ("gpu0",)) in plugin.calls
    assert "PreStartContainer: gpu0" in lines


def test_a_restarted_kubelet_gets_a_new_socket_and_a_new_registration(
        folder: Path, plugin: FakeDevicePlugin, kubelet: FakeRegistration, lines: list[str]) -> None:
    kubelet.stop()
    # A starting kubelet empties the folder (the plugin's socket too), then serves kubelet.sock.
    for entry in folder.iterdir():
        entry.unlink()
    restarted = FakeRegistration(folder)
    try:
        assert plugin.wait_registered(2, timeout_s=10), lines
        assert [r.endpoint for r in restarted.requests] == [plugin.endpoint]
        assert plugin.socket_path.is_socket()
        channel, stub = plugin_stub(plugin)
        with channel:
            assert as_tuples(next(stub.ListAndWatch(dp.Empty(), timeout=10)))[0] == \
                ("gpu0", "Healthy", [0])
    finally:
        restarted.stop()
    assert any("serving again" in line for line in lines)
    assert any("again (a new kubelet.sock)" in line for line in lines)


def test_a_refused_registration_is_said_and_tried_again(folder: Path, lines: list[str]) -> None:
    refusing = FakeRegistration(folder, refuse="cannot register resource example.com/gpu")
    try:
        with FakeDevicePlugin(DEVICES, plugin_dir=folder, poll_s=POLL_S, say=lines.append) as p:
            assert refusing.arrived.acquire(timeout=10)
            refusing.refuse = ""
            assert p.wait_registered(1, timeout_s=10), lines  # RETRY_REGISTER_S later
    finally:
        refusing.stop()
    assert len(refusing.requests) == 2
    assert any("registration with" in line and "UNKNOWN: cannot register resource" in line
               for line in lines), lines


def test_the_device_file_is_read_again_and_a_broken_edit_keeps_the_last_list(
        folder: Path, kubelet: FakeRegistration, lines: list[str]) -> None:
    devices_file = folder / "devices.yaml"
    devices_file.write_text(f"resource: {GPU}\ndevices: [{{id: a, numa: [0]}}]\n")
    from nri_numa.fake_device_plugin.devices import read_device_file
    with FakeDevicePlugin(read_device_file(devices_file), plugin_dir=folder, poll_s=POLL_S,
                          device_file=devices_file, say=lines.append) as p:
        channel, stub = plugin_stub(p)
        with channel:
            stream = stub.ListAndWatch(dp.Empty(), timeout=10)
            assert as_tuples(next(stream)) == [("a", "Healthy", [0])]
            devices_file.write_text(f"resource: {GPU}\ndevices: [{{id: a, numa: [0], "
                                    f"health: Unhealthy}}, {{id: b}}]\n")
            assert as_tuples(next(stream)) == [("a", "Unhealthy", [0]), ("b", "Healthy", [])]
            devices_file.write_text(f"resource: {GPU}\ndevices: [{{id: a, numa: [-1]}}]\n")
            devices_file.write_text(f"resource: {GPU}\ndevices: [{{id: a, numa: x}}]\n")
            for _ in range(100):
                if any("keeping the last devices" in line for line in lines):
                    break
                threading.Event().wait(POLL_S)
            stream.cancel()
    assert any(f"keeping the last devices: {devices_file}: devices[0].numa must be a list of "
               f"NUMA node numbers, not 'x'" in line for line in lines), lines
    assert [d.id for d in p.devices.devices] == ["a", "b"]


def test_a_socket_path_too_long_is_one_line(folder: Path) -> None:
    with pytest.raises(PluginError, match="longer than the 107 bytes"):
        FakeDevicePlugin(DEVICES, plugin_dir=folder, endpoint="x" * 120 + ".sock")


def test_python_m_registers_and_stops_on_sigterm(folder: Path, kubelet: FakeRegistration) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "nri_numa.fake_device_plugin", "--resource", GPU,
         "--device", "gpu0@0", "--device", "gpu1@1,0", "--plugin-dir", str(folder)],
        cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert kubelet.arrived.acquire(timeout=30)
        (request,) = kubelet.requests
        assert request.resource_name == GPU and request.endpoint == "fake-example-com-gpu.sock"
        channel = grpc.insecure_channel(f"unix://{folder / request.endpoint}")
        with channel:
            first = next(dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty(), timeout=10))
        assert as_tuples(first) == [("gpu0", "Healthy", [0]), ("gpu1", "Healthy", [1, 0])]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert "registered example.com/gpu with the kubelet at" in err
    assert not (folder / request.endpoint).exists()  # its socket removed on the way out
