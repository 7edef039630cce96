"""The fake device plugin's gRPC server and its registration with the kubelet.

``FakeDevicePlugin(devices, plugin_dir=...)`` serves ``v1beta1.DevicePlugin`` on
``<plugin_dir>/<endpoint>`` and registers with the kubelet's ``v1beta1.Registration`` on
``<plugin_dir>/kubelet.sock``, as a real device plugin does. A watcher thread, every
``poll_s``:

* reads the device file again when it changed, and sends the new list on every ListAndWatch
  stream (a broken edit keeps the last good list, with one line saying why);
* serves again on a new socket when its own socket file is gone (a starting kubelet empties the
  folder);
* registers again when ``kubelet.sock`` is another file than the one it registered with (a
  kubelet restart), or registers for the first time once it appears. A refused or failed
  registration is tried again every ``RETRY_REGISTER_S``.

The kubelet's calls are answered from the device list: Allocate gives each container one
environment variable per device (``FAKE_DEVICE_<n>=<id>``) and nothing else, so a container can
show which devices it got but touches no host device; GetPreferredAllocation prefers devices in
the list's order; PreStartContainer does nothing. Each call is kept in ``calls`` and said in one
line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from nri_numa.fake_device_plugin import API_VERSION, DEFAULT_PLUGIN_DIR, KUBELET_SOCKET_NAME
from nri_numa.fake_device_plugin.devices import (HEALTHY, UNHEALTHY, DeviceList, DeviceListError,
                                                 read_device_file)
from nri_numa.fake_device_plugin.pb import api_pb2 as dp
from nri_numa.fake_device_plugin.pb import api_pb2_grpc as dp_grpc
from nri_numa.safeio.bounds import quote

ENV_PREFIX = "FAKE_DEVICE_"
POLL_S = 0.5
RETRY_REGISTER_S = 2.0
REGISTER_TIMEOUT_S = 5.0
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its terminating NUL
WORKERS = 8  # each ListAndWatch stream holds one while it lasts


class PluginError(RuntimeError):
    """The plugin cannot serve (a socket path too long, a folder missing); one line."""


@dataclass(frozen=True, slots=True)
class PluginCall:
    """One call the kubelet made: the method and the device ids it named."""
    method: str
    device_ids: tuple[str, ...] = ()


def _say_on_stderr(line: str) -> None:
    print(f"fake device plugin: {line}", file=sys.stderr, flush=True)


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """Which file is at ``path`` (device, inode, change time): a file made anew differs even
    where the inode number is reused."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class FakeDevicePlugin:
    def __init__(self, devices: DeviceList, *, plugin_dir: str | Path = DEFAULT_PLUGIN_DIR,
                 endpoint: str | None = None, device_file: Path | None = None,
                 pre_start_required: bool = True, poll_s: float = POLL_S,
                 say: Callable[[str], None] = _say_on_stderr) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.endpoint = endpoint or "fake-" + devices.resource.replace("/", "-").replace(".", "-") + ".sock"
        if "/" in self.endpoint or self.endpoint in (".", "..", KUBELET_SOCKET_NAME):
            raise PluginError(f"endpoint {quote(self.endpoint)} must be a plain file name other "
                              f"than {KUBELET_SOCKET_NAME}")
        self.socket_path = self.plugin_dir / self.endpoint
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET_NAME
        if len(str(self.socket_path.absolute())) > MAX_SOCKET_PATH:
            raise PluginError(f"socket path {self.socket_path} is longer than the "
                              f"{MAX_SOCKET_PATH} bytes a unix socket path may have")
        self.device_file = device_file
        self.options = dp.DevicePluginOptions(pre_start_required=pre_start_required,
                                              get_preferred_allocation_available=True)
        self.calls: list[PluginCall] = []
        self.registrations = 0  # successful Register calls
        self._say = say
        self._poll_s = poll_s
        self._devices = devices
        self._version = 0  # bumped at every change of the list; streams send on a new one
        self._changed = threading.Condition()
        self._file_stamp: tuple[int, int] | None = None
        self._server: grpc.Server | None = None
        self._registered_with: tuple[int, int, int] | None = None
        self._next_register_try = 0.0
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        if device_file is not None:
            self._file_stamp = self._stamp(device_file)

    # --- life ---------------------------------------------------------------------------

    def start(self) -> FakeDevicePlugin:
        if not self.plugin_dir.is_dir():
            raise PluginError(f"device plugin folder {self.plugin_dir} does not exist (the kubelet "
                              f"makes it; or pass --plugin-dir)")
        self._serve()
        self._watcher = threading.Thread(target=self._watch, name="fake-device-plugin-watch",
                                         daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        if self.socket_path.is_socket():
            self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> FakeDevicePlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def devices(self) -> DeviceList:
        return self._devices

    def set_devices(self, devices: DeviceList) -> None:
        """Advertise another list (same resource); every ListAndWatch stream sends it."""
        if devices.resource != self._devices.resource:
            raise DeviceListError(f"the resource cannot change while the plugin runs "
                                  f"({self._devices.resource}, not {devices.resource})")
        with self._changed:
            self._devices = devices
            self._version += 1
            self._changed.notify_all()
        self._say(f"advertising {_describe(devices)}")

    def wait_registered(self, count: int = 1, timeout_s: float = 10.0) -> bool:
        """True once ``count`` registrations succeeded (tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.registrations >= count, timeout_s)

    # --- serving ------------------------------------------------------------------------

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
        if self.socket_path.is_socket():
            self.socket_path.unlink()  # left by an earlier run of this plugin
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS,
                                                        thread_name_prefix="fake-device-plugin"))
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        server.start()
        self._server = server
        self._say(f"serving {_describe(self._devices)} on {self.socket_path}")

    def _register(self) -> None:
        request = dp.RegisterRequest(version=API_VERSION, endpoint=self.endpoint,
                                     resource_name=self._devices.resource, options=self.options)
        with grpc.insecure_channel(f"unix://{self.kubelet_socket.absolute()}") as channel:
            dp_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)

    def _watch(self) -> None:
        while True:
            self._reload_file()
            if _file_identity(self.socket_path) is None:
                self._say(f"{self.socket_path} is gone (a kubelet starting empties the folder); "
                          f"serving again")
                self._serve()
                self._registered_with = None
            kubelet = _file_identity(self.kubelet_socket)
            if kubelet is not None and kubelet != self._registered_with \
                    and time.monotonic() >= self._next_register_try:
                self._try_register(kubelet)
            if self._stop.wait(self._poll_s):
                return

    def _try_register(self, kubelet: tuple[int, int, int]) -> None:
        again = self.registrations > 0
        try:
            self._register()
        except grpc.RpcError as e:
            self._next_register_try = time.monotonic() + RETRY_REGISTER_S
            self._say(f"registration with {self.kubelet_socket} failed ({e.code().name}: "
                      f"{e.details()}); trying again in {RETRY_REGISTER_S:.0f} s")
            return
        self._registered_with = kubelet
        with self._changed:
            self.registrations += 1
            self._changed.notify_all()
        self._say(f"registered {self._devices.resource} with the kubelet at {self.kubelet_socket}"
                  f"{' again (a new kubelet.sock)' if again else ''}")

    def _reload_file(self) -> None:
        if self.device_file is None:
            return
        stamp = self._stamp(self.device_file)
        if stamp is None or stamp == self._file_stamp:
            return  # removed while serving: keep what it said
        self._file_stamp = stamp
        try:
            self.set_devices(read_device_file(self.device_file))
        except DeviceListError as e:
            self._say(f"keeping the last devices: {e}")

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    # --- the kubelet's calls ------------------------------------------------------------

    def _note(self, method: str, ids: tuple[str, ...] = ()) -> None:
        self.calls.append(PluginCall(method, ids))
        self._say(f"{method}{': ' + ', '.join(ids) if ids else ''}")

    def list_and_watch(self, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        self._note("ListAndWatch")
        sent = -1
        while context.is_active() and not self._stop.is_set():
            with self._changed:
                if self._version == sent:
                    self._changed.wait(self._poll_s)
                    continue
                sent, devices = self._version, self._devices
            yield dp.ListAndWatchResponse(devices=[
                dp.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY,
                          topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=n) for n in d.numa])
                          if d.numa else None)
                for d in devices.devices])

    def allocate(self, request: dp.AllocateRequest,
                 context: grpc.ServicerContext) -> dp.AllocateResponse:
        replies = []
        for container in request.container_requests:
            ids = tuple(container.devicesIDs)
            self._note("Allocate", ids)
            unknown = [i for i in ids if self._devices.device(i) is None]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"unknown {self._devices.resource} device {unknown[0]!r}")
            replies.append(dp.ContainerAllocateResponse(
                envs={f"{ENV_PREFIX}{n}": device_id for n, device_id in enumerate(ids)}))
        return dp.AllocateResponse(container_responses=replies)

    def preferred_allocation(self, request: dp.PreferredAllocationRequest
                             ) -> dp.PreferredAllocationResponse:
        order = {d.id: n for n, d in enumerate(self._devices.devices)}
        replies = []
        for container in request.container_requests:
            chosen = list(dict.fromkeys(container.must_include_deviceIDs))
            for device_id in sorted(container.available_deviceIDs,
                                    key=lambda i: order.get(i, len(order))):
                if len(chosen) >= container.allocation_size:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
            self._note("GetPreferredAllocation", tuple(chosen))
            replies.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return dp.PreferredAllocationResponse(container_responses=replies)

    def pre_start(self, request: dp.PreStartContainerRequest) -> dp.PreStartContainerResponse:
        self._note("PreStartContainer", tuple(request.devicesIDs))
        return dp.PreStartContainerResponse()


class _Servicer(dp_grpc.DevicePluginServicer):
    """The generated service's methods, each handed to the plugin."""

    def __init__(self, plugin: FakeDevicePlugin) -> None:
        self._plugin = plugin

    def GetDevicePluginOptions(self, request, context):  # noqa: ANN001, ANN201, N802
        self._plugin._note("GetDevicePluginOptions")
        return self._plugin.options

    def ListAndWatch(self, request, context):  # noqa: ANN001, ANN201, N802
        return self._plugin.list_and_watch(context)

    def GetPreferredAllocation(self, request, context):  # noqa: ANN001, ANN201, N802
        return self._plugin.preferred_allocation(request)

    def Allocate(self, request, context):  # noqa: ANN001, ANN201, N802
        return self._plugin.allocate(request, context)

    def PreStartContainer(self, request, context):  # noqa: ANN001, ANN201, N802
        return self._plugin.pre_start(request)


def _describe(devices: DeviceList) -> str:
    return f"{devices.resource}: " + (", ".join(
        f"{d.id}{'@' + ','.join(map(str, d.numa)) if d.numa else ''}"
        f"{'' if d.healthy else ' (unhealthy)'}" for d in devices.devices) or "no devices")
