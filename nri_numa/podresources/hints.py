"""What the kubelet says a container holds → NUMA hints per resource, as the engine takes them
(``ContainerRequest.device_numa_hints``).

The device plugin reports each device's NUMA nodes and the kubelet passes them on
(``ContainerDevices.topology.nodes``); that is the first source. A plugin that reports no
topology still names its devices, and the common ids can be found in the machine's topology:
GPU UUIDs (NVIDIA's default ``DEVICE_ID_STRATEGY=uuid``, also with a time-slicing replica
suffix ``::N``), PCI addresses (SR-IOV and AMD plugins), and for ``nvidia.com/gpu`` NVML
indices (``DEVICE_ID_STRATEGY=index``). Nodes the machine does not have are dropped: a hint must
never name a node the engine cannot place on.

Devices of DRA claims (``ContainerResources.dynamic_resources``; DRA is GA since 1.34) carry no
topology: each is found by its name in the ResourceSlice (``device_name``: a GPU UUID or PCI
address, for drivers that name devices so), else by its CDI names, resolved through the node's
CDI spec files (``cdi_nodes``: DeviceLocator.cdi_numa_nodes); the hint is keyed by the driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from nri_numa.engine.context import GPU_RESOURCE
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.topology.model import Topology

_PCI_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_REPLICA_SUFFIX = "::"  # NVIDIA time-slicing / MPS: "GPU-<uuid>::3"


class DeviceNodes:
    """NUMA node of a device id, from the topology model; built once per topology."""

    def __init__(self, topology: Topology) -> None:
        self._numa_ids = frozenset(n.id for n in topology.numa_nodes)
        self._gpu_by_uuid = {g.uuid.lower(): g.numa_node for g in topology.gpus}
        self._gpu_by_index = {str(g.index): g.numa_node for g in topology.gpus}
        self._pci = {d.address: d.numa_node for d in topology.pci_devices}

    @property
    def numa_ids(self) -> frozenset[int]:
        return self._numa_ids

    def node_of(self, resource: str, device_id: str) -> int | None:
        """The NUMA node of one device id, or None when the machine does not know it."""
        ident = device_id.strip().split(_REPLICA_SUFFIX, 1)[0].lower()
        if ident in self._gpu_by_uuid:
            return self._gpu_by_uuid[ident]
        if (address := pci_address(ident)) is not None:
            return self._pci.get(address)
        if resource == GPU_RESOURCE:
            return self._gpu_by_index.get(ident)
        return None


def pci_address(text: str) -> str | None:
    """``0000:81:00.0`` as sysfs writes it; NVML's eight-digit domain is shortened."""
    m = _PCI_ADDRESS.fullmatch(text.lower())
    if m is None:
        return None
    domain = m[1][-4:] if m[1][:-4].strip("0") == "" else m[1]
    return f"{domain}:{m[2]}:{m[3]}.{m[4]}"


def find_container(pods: Iterable[pr.PodResources], namespace: str, pod: str,
                   container: str) -> pr.ContainerResources | None:
    """The container's entry among the kubelet's pods; None when the kubelet does not list it.
    (The first pod of that name that has the container: while a StatefulSet's pod is replaced,
    the kubelet may list the old and the new one.)"""
    for entry in pods:
        if entry.name == pod and entry.namespace == namespace:  # the name is the rarer match
            for c in entry.containers:
                if c.name == container:
                    return c
    return None


def pods_by_name(pods: Iterable[pr.PodResources]) -> dict[tuple[str, str], list[pr.PodResources]]:
    """The kubelet's pods by (namespace, name), each name's pods in the kubelet's order, so that
    ``find_container(index.get((namespace, pod), ()), …)`` answers as a walk of all of them."""
    index: dict[tuple[str, str], list[pr.PodResources]] = {}
    for entry in pods:
        index.setdefault((entry.namespace, entry.name), []).append(entry)
    return index


CdiNodes = Callable[[Iterable[str]], frozenset[int]]


def container_hints(container: pr.ContainerResources, devices: DeviceNodes,
                    cdi_nodes: CdiNodes | None = None) -> dict[str, frozenset[int]]:
    """Resource name (a DRA claim's: its driver) → NUMA nodes of the devices the kubelet gave
    ``container``; resources whose nodes are unknown are left out."""
    nodes: dict[str, set[int]] = {}
    for claim in container.dynamic_resources:
        for device in claim.claim_resources:
            found = nodes.setdefault(device.driver_name or "dra", set())
            node = devices.node_of(device.driver_name, device.device_name)
            if node is not None:
                found.add(node)
            elif cdi_nodes is not None and device.cdi_devices:
                found.update(cdi_nodes([d.name for d in device.cdi_devices]))
    for group in container.devices:
        if not group.resource_name:
            continue
        found = nodes.setdefault(group.resource_name, set())
        if group.topology.nodes:
            found.update(n.ID for n in group.topology.nodes)
        else:
            for device_id in group.device_ids:
                node = devices.node_of(group.resource_name, device_id)
                if node is not None:
                    found.add(node)
    return {name: frozenset(ids & devices.numa_ids) for name, ids in nodes.items()
            if ids & devices.numa_ids}

