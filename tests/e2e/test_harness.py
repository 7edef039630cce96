"""The harness against real containerd 1.7.24 and 2.1.9 with runc: pods and containers through CRI,
cpusets read from the host's cgroups and from inside the container, a restart that keeps the pod,
and a tiny external NRI plugin (raw frames, docs/nri-protocol.md §2-§5) whose adjustment really pins the
container to CPU 0. No code of nri_numa.nri is used: this proves the harness, not the plugin."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import grpc
import pytest

from nri_numa.topology.cpulist import parse_list
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cgroups import (
    CgroupLayout,
    allowed_inside,
    container_cgroup_path,
    process_cgroup,
    read_cpuset,
)
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, QoS, Resources
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes

pytestmark = pytest.mark.e2e

MiB = 1 << 20
GUARANTEED = Resources(cpu_request_m=1000, cpu_limit_m=1000, memory_request=64 * MiB, memory_limit=64 * MiB)


def host_cpus(layout: CgroupLayout) -> str:
    """The CPUs a container gets when nobody pins it: the root cpuset's."""
    name = "cpuset.effective_cpus" if layout.version == 1 else "cpuset.cpus.effective"
    return (layout.mount / name).read_text().strip()


# ---- pods and containers through CRI, cgroups from the host and from inside ------------------


def run_busybox(client: CriClient, pod: Pod, image: BuiltImage, times: StepTimes, version: str) -> tuple[str, str]:
    with times.step(version, f"RunPodSandbox ({pod.qos.value})"):
        sandbox_id = client.run_pod(pod)
    with times.step(version, "CreateContainer"):
        container_id = client.create_container(sandbox_id, pod.container_config("work", image.ref))
    with times.step(version, "StartContainer"):
        client.start_container(container_id)
    return sandbox_id, container_id


def test_runtime_is_the_version_asked_for(containerd: ContainerdDaemon, cri_client: CriClient,
                                          busybox_image: BuiltImage) -> None:
    version = cri_client.version()
    assert version.runtime_name == "containerd"
    assert version.runtime_version.startswith(containerd.version)
    assert cri_client.image_status(busybox_image.ref).image.id == busybox_image.config_digest


def test_pod_lifecycle_cpusets_and_restart(containerd: ContainerdDaemon, cri_client: CriClient,
                                           busybox_image: BuiltImage, cgroup_layout: CgroupLayout,
                                           step_times: StepTimes) -> None:
    version = containerd.version
    kept = Pod("kept", (GUARANTEED,))
    gone = Pod("gone", (Resources(),))
    kept_sandbox, kept_container = run_busybox(cri_client, kept, busybox_image, step_times, version)
    gone_sandbox, gone_container = run_busybox(cri_client, gone, busybox_image, step_times, version)
    assert (kept.qos, gone.qos) == (QoS.GUARANTEED, QoS.BESTEFFORT)

    # The kubelet-style resources arrive as sent.
    sent = cri_client.container_status(kept_container).status
    assert sent.state == cri.CONTAINER_RUNNING
    assert (sent.resources.linux.cpu_shares, sent.resources.linux.cpu_quota, sent.resources.linux.cpu_period,
            sent.resources.linux.memory_limit_in_bytes) == (1024, 100_000, 100_000, 64 * MiB)

    # Unpinned, the container sees every host CPU, from inside and in its cgroup under the pod's.
    with step_times.step(version, "ExecSync cat /proc/self/status"):
        inside = allowed_inside(cri_client, kept_container)
    info = cri_client.container_info(kept_container)
    cgroup = container_cgroup_path(info)
    assert cgroup == f"{kept.cgroup_parent}/{kept_container}"
    assert process_cgroup(int(info["pid"]), cgroup_layout) == cgroup
    cpuset = read_cpuset(cgroup_layout, cgroup)
    assert inside.cpu_ids == cpuset.effective_cpu_ids == parse_list(host_cpus(cgroup_layout))

    with step_times.step(version, "StopPodSandbox + RemovePodSandbox"):
        cri_client.stop_pod(gone_sandbox)
        cri_client.remove_pod(gone_sandbox)
    assert not (cgroup_layout.mount / gone.cgroup_parent.lstrip("/") / gone_container).exists()

    with step_times.step(version, "containerd restart"):
        containerd.restart()
    pods = {p.id: p for p in cri_client.list_pods()}
    assert gone_sandbox not in pods
    assert pods[kept_sandbox].state == cri.SANDBOX_READY
    assert pods[kept_sandbox].labels["io.kubernetes.pod.uid"] == kept.uid
    containers = {c.id: c for c in cri_client.list_containers(kept_sandbox)}
    assert containers[kept_container].state == cri.CONTAINER_RUNNING
    assert allowed_inside(cri_client, kept_container) == inside
    assert read_cpuset(cgroup_layout, cgroup) == cpuset

    with step_times.step(version, "StopContainer + RemoveContainer"):
        cri_client.stop_container(kept_container)
        cri_client.remove_container(kept_container)
    assert cri_client.list_containers(kept_sandbox) == []


def test_update_container_resources_repins_a_running_container(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, step_times: StepTimes) -> None:
    """The kubelet's CPU manager path: UpdateContainerResources with cpuset_cpus."""
    pod = Pod("update", (GUARANTEED,))
    _, container_id = run_busybox(cri_client, pod, busybox_image, step_times, containerd.version)
    cgroup = container_cgroup_path(cri_client.container_info(container_id))
    resources = cri_client.container_status(container_id).status.resources.linux
    resources.cpuset_cpus = "0"
    with step_times.step(containerd.version, "UpdateContainerResources"):
        cri_client.update_container_resources(container_id, resources)
    assert read_cpuset(cgroup_layout, cgroup).cpus == "0"
    assert allowed_inside(cri_client, container_id).cpus == "0"


def test_a_bad_request_is_a_clear_grpc_error(cri_client: CriClient) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        cri_client.start_container("no-such-container")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


# ---- a minimal external NRI plugin speaking raw frames ----------------------------------------

PLUGIN_CONN, RUNTIME_CONN = 1, 2  # conn 1: runtime calls the plugin; conn 2: plugin calls the runtime
TTRPC_REQUEST, TTRPC_RESPONSE = 1, 2
MAX_OUTGOING_FRAME = 4096  # containerd's mux cannot take a bigger frame (docs/nri-protocol.md §2.4)
EVENT_CREATE_CONTAINER = 0x8
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"


def pb_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def pb_bytes(number: int, data: bytes) -> bytes:
    return pb_varint(number << 3 | 2) + pb_varint(len(data)) + data


def pb_uint(number: int, value: int) -> bytes:
    return pb_varint(number << 3) + pb_varint(value)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def pb_fields(data: bytes) -> dict[int, list[bytes | int]]:
    """field number -> values: ints for varints, bytes for everything else."""
    fields: dict[int, list[bytes | int]] = {}
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        wire = key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 2:
            size, at = _read_varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            size = {1: 8, 5: 4}[wire]
            value, at = data[at:at + size], at + size
        fields.setdefault(key >> 3, []).append(value)
    return fields


def cpuset_adjustment(cpus: str) -> bytes:
    """CreateContainerResponse{adjust{linux{resources{cpu{cpus}}}}}: field numbers 1/6/2/2/6."""
    return pb_bytes(1, pb_bytes(6, pb_bytes(2, pb_bytes(2, pb_bytes(6, cpus.encode())))))


class RawNriPlugin:
    """Registers, subscribes to CreateContainer only, answers Synchronize with nothing, and pins
    every created container to `cpus`. One reader thread answers the runtime inline, so Configure
    may arrive before the RegisterPlugin reply (docs/nri-protocol.md §5) without a deadlock."""

    def __init__(self, socket_path: Path, name: str, index: str, cpus: str) -> None:
        self.socket_path, self.name, self.index, self.cpus = socket_path, name, index, cpus
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.write_lock = threading.Lock()
        self.registered, self.synchronized = threading.Event(), threading.Event()
        self.methods: list[str] = []
        self.created: list[str] = []
        self.errors: list[str] = []
        self.reader = threading.Thread(target=self._read_loop, name=f"nri-{name}", daemon=True)

    def start(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # a stale nri.sock refuses connections until containerd has made a new one
            try:
                self.sock.connect(str(self.socket_path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.reader.start()
        register = pb_bytes(1, self.name.encode()) + pb_bytes(2, self.index.encode())
        request = (pb_bytes(1, RUNTIME_SERVICE.encode()) + pb_bytes(2, b"RegisterPlugin")
                   + pb_bytes(3, register) + pb_uint(4, 5_000_000_000))
        self._send(RUNTIME_CONN, 1, TTRPC_REQUEST, request)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self.reader.is_alive():
            self.reader.join(5)

    def _send(self, conn: int, stream: int, kind: int, body: bytes) -> None:
        message = struct.pack(">IIBB", len(body), stream, kind, 0) + body
        assert len(message) <= MAX_OUTGOING_FRAME, "this tiny plugin only sends one-frame messages"
        with self.write_lock:
            self.sock.sendall(struct.pack(">II", conn, len(message)) + message)

    def _recv_exact(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def _read_loop(self) -> None:
        buffers = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
        try:
            while True:
                conn, size = struct.unpack(">II", self._recv_exact(8))
                buffer = buffers.setdefault(conn, bytearray())
                buffer += self._recv_exact(size)
                while len(buffer) >= 10 and len(buffer) >= 10 + struct.unpack_from(">I", buffer)[0]:
                    length, stream, kind, _ = struct.unpack_from(">IIBB", buffer)
                    body = bytes(buffer[10:10 + length])
                    del buffer[:10 + length]
                    self._dispatch(conn, stream, kind, body)
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - reported by the test, never lost in a thread
            self.errors.append(repr(exc))

    def _dispatch(self, conn: int, stream: int, kind: int, body: bytes) -> None:
        if conn == RUNTIME_CONN and kind == TTRPC_RESPONSE:
            status = pb_fields(body).get(1)
            code = pb_fields(status[0]).get(1, [0])[0] if status else 0
            if code:
                self.errors.append(f"RegisterPlugin failed with code {code}: {pb_fields(status[0]).get(2)}")
            self.registered.set()
        elif conn == PLUGIN_CONN and kind == TTRPC_REQUEST:
            request = pb_fields(body)
            method = request[2][0].decode()
            self.methods.append(method)
            reply = self._answer(method, request.get(3, [b""])[0])
            self._send(PLUGIN_CONN, stream, TTRPC_RESPONSE, pb_bytes(2, reply) if reply else b"")
            if method == "Synchronize":
                self.synchronized.set()

    def _answer(self, method: str, payload: bytes) -> bytes:
        if method == "Configure":
            return pb_uint(2, EVENT_CREATE_CONTAINER)  # ConfigureResponse.events
        if method == "CreateContainer":
            container = pb_fields(pb_fields(payload)[2][0])  # CreateContainerRequest.container
            self.created.append(container[3][0].decode())  # Container.name
            return cpuset_adjustment(self.cpus)
        return b""  # Synchronize (no updates), Shutdown, anything else: an empty OK


def wait_for_log(daemon: ContainerdDaemon, text: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in daemon.log_text():
        assert time.monotonic() < deadline, f"containerd never logged {text!r}"
        time.sleep(0.02)


def test_external_nri_plugin_pins_the_container_to_cpu_0(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, step_times: StepTimes) -> None:
    assert parse_list(host_cpus(cgroup_layout)) != {0}, "needs a second CPU to tell a pinned container apart"
    plugin = RawNriPlugin(containerd.paths.nri_socket, "e2e-raw", "10", cpus="0")
    try:
        with step_times.step(containerd.version, "NRI plugin register + Synchronize"):
            plugin.start()
            assert plugin.synchronized.wait(5), f"no Synchronize: saw {plugin.methods}, errors {plugin.errors}"
            # containerd adds the plugin to its list right after the Synchronize reply, and says so.
            wait_for_log(containerd, 'plugin \\"10-e2e-raw\\" connected')
        assert plugin.registered.is_set()
        pod = Pod("pinned", (Resources(cpu_request_m=500, memory_request=16 * MiB),))
        _, container_id = run_busybox(cri_client, pod, busybox_image, step_times, containerd.version)
        assert plugin.created == ["work"]
        assert plugin.methods[:2] == ["Configure", "Synchronize"]

        info = cri_client.container_info(container_id)
        assert info["runtimeSpec"]["linux"]["resources"]["cpu"]["cpus"] == "0"
        assert read_cpuset(cgroup_layout, container_cgroup_path(info)).cpus == "0"
        assert allowed_inside(cri_client, container_id).cpus == "0"
    finally:
        plugin.close()
    assert plugin.errors == []
