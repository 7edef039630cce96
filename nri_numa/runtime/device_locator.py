"""The devices a container already has, found on the machine: their NUMA nodes (hints, so CPUs
and memory follow them) and their identities (so a restarted plugin can hold them again).

NVIDIA nodes (``/dev/nvidiaN``) have no sysfs entry: they are matched to the topology's GPUs by
minor (NVML's, else the driver's ``/proc/driver/nvidia``). Other char and block devices are
followed from ``/sys/dev/<kind>/MAJ:MIN`` to the nearest PCI function above them.
``NVIDIA_VISIBLE_DEVICES`` (UUIDs or NVML indices) names GPUs the NVIDIA runtime hook adds after
the runtime asked us. CDI names in ``cdi.k8s.io/*`` annotations: a GPU by UUID (any kind) or NVML
index (``nvidia.com/gpu``), else the nodes the spec files give that name, followed as above.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa.engine.context import GPU_RESOURCE
from nri_numa.runtime.container import DeviceNode, RuntimeContainer
from nri_numa.runtime.device_markers import (CDI_ANNOTATION_PREFIX, NVIDIA_MAJOR,
                                             NVIDIA_VISIBLE_DEVICES)
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Gpu

if TYPE_CHECKING:
    from nri_numa.engine.devices import Resource
    from nri_numa.runtime.cdi import CdiRegistry
    from nri_numa.runtime.cdi_names import CdiName

log = logging.getLogger(__name__)

_NVIDIA_NODE = r"/dev/nvidia(\d+)"  # compiled (and kept) by re at the first NVIDIA device


@dataclass(frozen=True, slots=True)
class _Found:
    """One device of a container: a GPU (by UUID), a PCI function (by address) or a node
    the topology cannot place (``device_id`` None)."""

    hint_key: str  # ``nvidia.com/gpu``, else the device node's path
    device_id: str | None
    numa_node: int | None


class DeviceLocator:
    """Finds a container's devices through the topology model. Results are cached per device
    number: sysfs links do not change while a device exists."""

    def __init__(self, topology: Topology, sysfs_root: str | Path = "/",
                 cdi: CdiRegistry | None = None) -> None:
        self._topology = topology
        self._root = Path(sysfs_root)
        # The CDI registry and the GPUs' minors (which may read /proc/driver/nvidia) are made
        # when a container first has a CDI annotation or an NVIDIA node: an OCI hook process
        # builds a locator per run, and most containers have neither.
        self._cdi = cdi
        self._gpu_by_minor: dict[int, Gpu] | None = None
        self._gpu_by_uuid = {g.uuid: g for g in topology.gpus}
        self._gpu_by_index = {str(g.index): g for g in topology.gpus}
        self._pci_address: dict[tuple[str, int, int], str | None] = {}
        self._reported: set[str] = set()

    def numa_hints(self, container: RuntimeContainer) -> dict[str, frozenset[int]]:
        """Resource (``nvidia.com/gpu``, else the device path) → NUMA nodes of its devices."""
        hints: dict[str, set[int]] = {}
        for found in self._devices(container):
            if found.numa_node is not None:
                hints.setdefault(found.hint_key, set()).add(found.numa_node)
        return {name: frozenset(nodes) for name, nodes in hints.items()}

    def cdi_numa_nodes(self, names: Iterable[str]) -> frozenset[int]:
        """NUMA nodes of the devices fully-qualified CDI names stand for (a DRA claim's
        devices, as the kubelet's PodResources reports them): GPUs named by UUID, else the
        nodes the spec files give. Names that cannot be read or found give nothing."""
        from nri_numa.runtime.cdi_names import CdiNameError, parse_name

        parsed = []
        for text in names:
            try:
                parsed.append(parse_name(text))
            except CdiNameError as e:
                self._report(f"CDI name from the kubelet: {e}; not used")
        gpus, nodes = self._cdi_named(parsed)
        found = {g.numa_node for g, _ in filter(None, gpus)}
        for device in nodes:
            gpu = self._nvidia_gpu(device)
            found.add(gpu.numa_node if gpu is not None else self._pci_function(device).numa_node)
        return frozenset(n for n in found if n is not None)

    def held_devices(self, container: RuntimeContainer,
                     resources: Mapping[str, Resource]) -> dict[str, frozenset[str]]:
        """Resource → ids of the container's devices that are devices of ``resources`` (GPUs
        by UUID, NICs by PCI address)."""
        ids = {f.device_id for f in self._devices(container) if f.device_id is not None}
        held = {name: frozenset(d.id for d in resource.devices if d.id in ids)
                for name, resource in resources.items()}
        return {name: devices for name, devices in held.items() if devices}

    def _devices(self, container: RuntimeContainer) -> list[_Found]:
        gpus = [self._gpu_named(item, by_index=True) for item in
                container.env.get(NVIDIA_VISIBLE_DEVICES, "").split(",")]
        cdi_gpus, cdi_nodes = self._cdi_devices(container)
        gpus += cdi_gpus
        named = [g for g in gpus if g is not None]
        # A MIG instance also brings its GPU's /dev/nvidiaN: that node is then the instance's.
        parts = {g.uuid for g, whole in named if not whole} - {g.uuid for g, whole in named if whole}
        found = []
        for device in (*container.devices, *cdi_nodes):
            gpu = self._nvidia_gpu(device)
            if gpu is not None:
                named.append((gpu, gpu.uuid not in parts))
            else:
                found.append(self._pci_function(device))
        # A MIG instance pulls towards its GPU's node but is not the GPU: no id to hold.
        return [_Found(GPU_RESOURCE, g.uuid if whole else None, g.numa_node)
                for g, whole in named] + found

    def _cdi_devices(self, container: RuntimeContainer
                     ) -> tuple[list[tuple[Gpu, bool] | None], list[DeviceNode]]:
        """The container's CDI names: the GPUs named by UUID or index (``_gpu_named``), and
        the nodes the spec files give any other name."""
        if not any(key.startswith(CDI_ANNOTATION_PREFIX) for key in container.annotations):
            return [], []
        from nri_numa.runtime.cdi_names import annotation_names

        names, problems = annotation_names(container.annotations)
        for problem in problems:
            self._report(f"container {container.name or container.id}: {problem}; not used")
        return self._cdi_named(names)

    def _cdi_named(self, names: Iterable[CdiName]
                   ) -> tuple[list[tuple[Gpu, bool] | None], list[DeviceNode]]:
        from nri_numa.runtime.cdi import ALL_DEVICES, NVIDIA_GPU_KIND, device_node

        gpus: list[tuple[Gpu, bool] | None] = []
        nodes: list[DeviceNode] = []
        for name in names:
            # Indices only mean NVML's under nvidia.com/gpu; UUIDs are unique whatever the kind
            # (NVIDIA's device plugin writes its own kind).
            gpu = self._gpu_named(name.device, by_index=name.kind == NVIDIA_GPU_KIND)
            if gpu is not None:
                gpus.append(gpu)
            elif name.device != ALL_DEVICES and \
                    (device := self._cdi_registry().device(name)) is not None:
                nodes += [n for n in map(device_node, (*device.nodes, *device.spec_nodes))
                          if n is not None]
        return gpus, nodes

    def _gpu_named(self, text: str, by_index: bool) -> tuple[Gpu, bool] | None:
        """The GPU a name means and whether it is the whole GPU: a GPU UUID; with
        ``by_index``, an NVML index, or a MIG instance as ``<GPU index>:<MIG index>`` (its GPU,
        not whole). None for anything else: "all" spans every GPU, which says nothing about
        where to run; MIG UUIDs (``MIG-…``) need NVML's MIG tables, which the topology does not
        keep (docs/devices.md); a spec file that lists one still leads to its GPU's node."""
        text = text.strip()
        gpu = self._gpu_by_uuid.get(text)
        if gpu is not None:
            return gpu, True
        if not by_index:
            return None
        index, colon, instance = text.partition(":")
        if colon and not instance.isdigit():
            return None
        gpu = self._gpu_by_index.get(index)
        return None if gpu is None else (gpu, not colon)

    def _report(self, problem: str) -> None:
        if problem not in self._reported and len(self._reported) < 1024:
            self._reported.add(problem)
            log.warning("%s", problem)

    def _nvidia_gpu(self, device: DeviceNode) -> Gpu | None:
        if device.type not in ("c", "u") or device.major != NVIDIA_MAJOR:
            return None
        m = re.fullmatch(_NVIDIA_NODE, device.path)
        if not m:
            return None
        if self._gpu_by_minor is None:
            from nri_numa.runtime.device_grant import gpus_by_minor

            self._gpu_by_minor = gpus_by_minor(self._topology, self._root)
        return self._gpu_by_minor.get(device.minor)

    def _cdi_registry(self) -> CdiRegistry:
        if self._cdi is None:
            from nri_numa.runtime.cdi import CdiRegistry

            self._cdi = CdiRegistry()
        return self._cdi

    def _pci_function(self, device: DeviceNode) -> _Found:
        address = self._cached_pci_address(device)
        pci = None if address is None else self._topology.pci(address)
        if pci is None:
            return _Found(device.path, None, None)
        return _Found(device.path, pci.address, pci.numa_node)

    def _cached_pci_address(self, device: DeviceNode) -> str | None:
        if device.type not in ("c", "u", "b"):
            return None
        kind = "block" if device.type == "b" else "char"
        key = (kind, device.major, device.minor)
        if key not in self._pci_address:
            self._pci_address[key] = self._read_pci_address(kind, device.major, device.minor)
        return self._pci_address[key]

    def _read_pci_address(self, kind: str, major: int, minor: int) -> str | None:
        link = self._root / "sys" / "dev" / kind / f"{major}:{minor}"
        try:
            target = os.path.realpath(link, strict=True)
        except OSError:
            return None
        from nri_numa.topology.sysfs_read import pci_address_of

        return pci_address_of(target)
