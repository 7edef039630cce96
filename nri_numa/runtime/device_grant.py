"""The devices the engine allocated → what a container needs to use them: device nodes, their
device-cgroup rules and environment. Both front doors that can give devices use it: the NRI
plugin (``ContainerAdjustment``) and podman's precreate hook (the OCI spec).

* **GPUs** (``nvidia.com/gpu``, by UUID): ``/dev/nvidia<minor>`` for each, plus the driver's
  shared nodes ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` where the
  host has them, and ``NVIDIA_VISIBLE_DEVICES=<uuids>`` (the NVIDIA container runtime hook, when
  installed, reads it and adds the driver's libraries). The minor comes from the topology (NVML),
  else from ``/proc/driver/nvidia/gpus/<pci>/information``.
* **NICs** (``pci/<vendor>:<device>``, by PCI address): the RDMA nodes of the NIC's RDMA devices,
  ``/dev/infiniband/uverbsN`` (found through ``/sys/class/infiniband_verbs/uverbsN/ibdev``),
  plus ``/dev/infiniband/rdma_cm``, where the host has them. The netdev itself is not moved into
  the container: that is the CNI's business (docs/devices.md).

Device numbers are read from the host's nodes under ``dev_root`` (``/dev``): ``nvidia-uvm``'s
major is given out at module load, so it cannot be assumed. A GPU node the host lacks gets the
driver's fixed major 195. Everything is looked up per call; nothing is cached, since nodes come
and go with the driver.

**GPUs by CDI name** instead (``injection``: ``cdi``, or ``auto`` once the runtime is known to
apply them, ``use_runtime``): each GPU becomes the name of the CDI device that injects it
(``CdiRegistry.gpu_device_name``), and the runtime applies the spec's edits (nodes, the
driver's libraries, its environment); no node and no ``NVIDIA_VISIBLE_DEVICES`` are sent. A
container's GPUs all go one way: under ``auto``, when one of them has no CDI device, all get
nodes; under ``cdi`` that container is refused. NICs always get nodes (CDI has no common kind
for them).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from nri_numa.engine.context import GPU_RESOURCE
from nri_numa.engine.devices.requested import PCI_PREFIX
from nri_numa.runtime.cdi import (AUTO, CDI, INJECTION_MODES, NODES, CdiRegistry, host_device,
                                  runtime_applies_cdi)
from nri_numa.runtime.device_markers import NVIDIA_MAJOR, NVIDIA_VISIBLE_DEVICES
from nri_numa.topology.model import Topology
from nri_numa.topology.nvidia_proc import driver_minors
from nri_numa.topology.parts import Gpu

NVIDIA_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
RDMA_CM_NODE = "infiniband/rdma_cm"
UVERBS_CLASS = "sys/class/infiniband_verbs"
DEVICE_FILE_MODE = 0o666
DEVICE_ACCESS = "rwm"


class GrantError(ValueError):
    """An allocated device that cannot be handed over; the message names it."""


@dataclass(frozen=True, slots=True)
class GrantedNode:
    """A device node to create in the container, and to allow in its device cgroup."""

    path: str  # in the container, the same as on the host
    type: str  # "c" or "b"
    major: int
    minor: int
    file_mode: int = DEVICE_FILE_MODE
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    nodes: tuple[GrantedNode, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # CDI names the runtime injects (nvidia.com/gpu=<uuid>)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "cdi_devices", tuple(self.cdi_devices))

    def __bool__(self) -> bool:
        return bool(self.nodes or self.env or self.cdi_devices)


class DeviceGranter:
    """Turns a placement's devices into a ``Grant``. ``dev_root`` is the host's ``/dev``;
    ``root`` is where ``sys`` and ``proc`` are read (``/`` on a live machine); ``cdi`` the CDI
    spec dirs and ``injection`` how GPUs are given (``nodes``, ``cdi``, ``auto``)."""

    def __init__(self, topology: Topology, dev_root: str | Path = "/dev",
                 root: str | Path = "/", *, cdi: CdiRegistry | None = None,
                 injection: str = NODES) -> None:
        if injection not in INJECTION_MODES:
            raise ValueError(f"device injection {injection!r} is not one of "
                             f"{', '.join(INJECTION_MODES)}")
        self._topology = topology
        self._dev = Path(dev_root)
        self._root = Path(root)
        self._gpus = {g.uuid: g for g in topology.gpus}
        self._cdi = cdi or CdiRegistry()
        self._injection = injection
        self._runtime_applies_cdi = False

    def use_runtime(self, name: str, version: str) -> str:
        """Learn the runtime (from NRI's Configure); returns a line for the log saying how
        GPUs will be given."""
        self._runtime_applies_cdi = runtime_applies_cdi(name, version)
        runtime = f"{name or 'the runtime'} {version}".strip()
        dirs = ", ".join(map(str, self._cdi.spec_dirs))
        if self._injection == NODES:
            return "device injection nodes: GPUs get device nodes"
        if self._injection == CDI:
            return f"device injection cdi: GPUs by CDI name from {dirs}"
        if self._runtime_applies_cdi:
            return (f"device injection auto: {runtime} applies CDI devices; GPUs by CDI name "
                    f"where {dirs} define them, else device nodes")
        return (f"device injection auto: {runtime} is not known to apply CDI devices "
                "(containerd >= 2.1 is); GPUs get device nodes")

    def grant(self, devices: Mapping[str, Iterable[str]]) -> Grant:
        """GrantError for a device this machine cannot hand over."""
        nodes: list[GrantedNode] = []
        env: dict[str, str] = {}
        cdi_devices: tuple[str, ...] = ()
        gpus = tuple(devices.get(GPU_RESOURCE, ()))
        if gpus:
            minors = self.gpu_minors()  # may read /proc/driver/nvidia: once per grant
            cdi_devices = self._gpu_cdi_names(gpus, minors)
            if not cdi_devices:
                nodes += self._gpu_nodes(gpus, minors)
                env[NVIDIA_VISIBLE_DEVICES] = ",".join(gpus)
        nics = [a for name, ids in sorted(devices.items()) if name.startswith(PCI_PREFIX)
                for a in ids]
        if nics:
            nodes += self._nic_nodes(nics)
        unique = {n.path: n for n in nodes}  # shared nodes are named once
        return Grant(tuple(unique.values()), env, cdi_devices)

    # --- GPUs --------------------------------------------------------------------------------

    def _gpu_cdi_names(self, uuids: tuple[str, ...],
                       minors: Mapping[str, int]) -> tuple[str, ...]:
        """The GPUs' CDI names when they go by CDI; () for device nodes."""
        if self._injection == NODES or (self._injection == AUTO
                                        and not self._runtime_applies_cdi):
            return ()
        names = []
        for uuid in uuids:
            gpu = self._gpu(uuid)
            name = self._cdi.gpu_device_name(uuid, gpu.index, minors.get(uuid))
            if name is None:
                if self._injection == AUTO:
                    return ()
                dirs = ", ".join(map(str, self._cdi.spec_dirs))
                raise GrantError(f"GPU {uuid} ({gpu.pci_address}): no CDI device in {dirs} "
                                 "names it (by UUID, by its /dev/nvidia<minor> node or by "
                                 "index), and device injection is cdi; generate the spec "
                                 "(nvidia-ctk cdi generate) or use --device-injection auto")
            names.append(name)
        return tuple(names)

    def _gpu_nodes(self, uuids: tuple[str, ...],
                   minors: Mapping[str, int]) -> list[GrantedNode]:
        nodes = []
        for uuid in uuids:
            gpu = self._gpu(uuid)
            minor = minors.get(uuid)
            if minor is None:
                raise GrantError(f"GPU {uuid} ({gpu.pci_address}): its /dev/nvidia<minor> is "
                                 "known neither to the topology (NVML) nor to "
                                 "/proc/driver/nvidia/gpus; cannot add its device node")
            name = f"nvidia{minor}"
            nodes.append(self._host_node(name) or GrantedNode(f"/dev/{name}", "c", NVIDIA_MAJOR,
                                                              minor))
        nodes += [n for n in map(self._host_node, NVIDIA_SHARED_NODES) if n is not None]
        return nodes

    def _gpu(self, uuid: str) -> Gpu:
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise GrantError(f"GPU {uuid} is not a GPU of this machine")
        return gpu

    def gpu_minors(self) -> dict[str, int]:
        return gpu_minors(self._topology, self._root)

    # --- NICs --------------------------------------------------------------------------------

    def _nic_nodes(self, addresses: list[str]) -> list[GrantedNode]:
        rdma_names = {name for a in addresses for name in self._rdma_names(a)}
        nodes = [self._host_node(f"infiniband/{uverbs}")
                 for uverbs, ibdev in self._uverbs().items() if ibdev in rdma_names]
        found = [n for n in nodes if n is not None]
        if found:
            cm = self._host_node(RDMA_CM_NODE)
            if cm is not None:
                found.append(cm)
        return found

    def _rdma_names(self, address: str) -> tuple[str, ...]:
        return tuple(name for nic in self._topology.nics if nic.pci_address == address
                     for name in nic.rdma)

    def _uverbs(self) -> dict[str, str]:
        """uverbsN → the RDMA device it serves (``mlx5_0``), from sysfs."""
        folder = self._root / UVERBS_CLASS
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            return {}
        out = {}
        for entry in entries:
            try:
                out[entry] = (folder / entry / "ibdev").read_text().strip()
            except OSError:
                continue
        return out

    # --- host nodes --------------------------------------------------------------------------

    def _host_node(self, name: str) -> GrantedNode | None:
        """``/dev/<name>`` as the host has it (its real type and numbers); None when absent
        or not a device node."""
        host = host_device(self._dev / name)
        return None if host is None else GrantedNode(f"/dev/{name}", *host)


def gpu_minors(topology: Topology, root: str | Path = "/") -> dict[str, int]:
    """GPU UUID → the minor of its ``/dev/nvidiaN``: the topology's (NVML), else what the driver
    shows under ``root``/proc (read only when some GPU lacks one)."""
    minors = {g.uuid: g.minor for g in topology.gpus if g.minor is not None}
    if len(minors) < len(topology.gpus):
        by_address = driver_minors(root)
        for gpu in topology.gpus:
            if gpu.uuid not in minors and gpu.pci_address in by_address:
                minors[gpu.uuid] = by_address[gpu.pci_address]
    return minors


def gpus_by_minor(topology: Topology, root: str | Path = "/") -> dict[int, Gpu]:
    """minor → GPU, for the GPUs whose minor is known."""
    by_uuid = {g.uuid: g for g in topology.gpus}
    return {m: by_uuid[u] for u, m in gpu_minors(topology, root).items()}
