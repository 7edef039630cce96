"""Device provider: the kubelet Device Manager's hints and allocation, with our own choosers.

* ``hints`` — NUMA hints per device resource (container and pod scope), as the kubelet makes them.
* ``allocate`` — which devices a container gets: reusable first, then the aligned / unaligned /
  no-affinity split, asking a ``Chooser`` where the kubelet asks the device plugin.
* ``gpu_select`` — the GPU chooser: the set with the best NVLink/PCIe link score.
* ``nic_select`` — the NIC chooser: PCIe proximity to the GPUs the container got.

A device id is whatever the resource's devices are called (GPU UUIDs, PCI addresses, netdev
names); where the kubelet walks a Go map, this package walks ids in ``device_id_key`` order so the
same inputs always give the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

# (available ids, ids that must be in the answer, how many in all) -> preferred ids, best first.
# The kubelet's GetPreferredAllocation call, answered in-process.
Chooser = Callable[[Sequence[str], Sequence[str], int], Sequence[str]]

_DIGITS = re.compile(r"(\d+)")


def device_id_key(device_id: str) -> tuple:
    """Sort key that orders digit runs by value, so nvidia2 comes before nvidia10."""
    return tuple((0, int(part), part) if part.isdigit() else (1, 0, part)
                 for part in _DIGITS.split(device_id) if part)


def sorted_ids(ids: Iterable[str]) -> list[str]:
    return sorted(ids, key=device_id_key)


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a resource; ``numa_nodes`` empty means the plugin gave no topology."""

    id: str
    numa_nodes: frozenset[int] = frozenset()
    healthy: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a device id must be a non-empty string, not {self.id!r}")
        nodes = frozenset(self.numa_nodes)
        bad = sorted(repr(n) for n in nodes
                     if isinstance(n, bool) or not isinstance(n, int) or n < 0)
        if bad:
            raise ValueError(f"device {self.id}: NUMA node ids must be non-negative integers, "
                             f"not {', '.join(bad)}")
        object.__setattr__(self, "numa_nodes", nodes)


@dataclass(frozen=True, slots=True)
class Resource:
    """A device-plugin resource (``nvidia.com/gpu``) and every device it has, healthy or not."""

    name: str
    devices: tuple[Device, ...]
    _by_id: Mapping[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        devices = tuple(sorted(self.devices, key=lambda d: device_id_key(d.id)))
        by_id = {d.id: d for d in devices}
        if len(by_id) != len(devices):
            repeated = sorted({d.id for d in devices if [e.id for e in devices].count(d.id) > 1})
            raise ValueError(f"resource {self.name}: device ids repeat: {', '.join(repeated)}")
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "_by_id", MappingProxyType(by_id))

    @property
    def has_topology(self) -> bool:
        """The kubelet aligns a resource only if at least one device names a NUMA node."""
        return any(d.numa_nodes for d in self.devices)

    @property
    def healthy_ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self.devices if d.healthy)

    def numa_nodes_of(self, device_id: str) -> frozenset[int]:
        """The device's NUMA nodes; empty for a device without topology or an unknown id."""
        device = self._by_id.get(device_id)
        return device.numa_nodes if device is not None else frozenset()
