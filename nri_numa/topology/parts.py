"""The parts of a machine as immutable values: CPUs, NUMA nodes (with their memory and
hugepages), PCI devices, NICs and GPUs; and how two PCI devices reach each other.

Group ids (``core``, ``die``, ``l3``) are the lowest CPU number in the group: the kernel's own ids
repeat across packages (``core_id``), are sparse, or are missing (cache ``id``), while the lowest
member is unique, stable and readable ("core 3 = CPUs 3,59"). ``socket`` keeps the kernel's
``physical_package_id`` because people know their sockets by it; where the kernel gives none it
falls back to the lowest CPU of the package. Offline CPUs keep their NUMA node (from the
``cpuN/nodeM`` link) and have no core, die, socket or L3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# nvmlGpuTopologyLevel_t, nearest first; the same words name PCIe relationships between any two
# devices (see pcie_level).
PCIE_LEVELS = ("internal", "single", "multiple", "hostbridge", "node", "system")


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class Cpu:
    id: int
    numa: int | None
    online: bool = True
    core: int | None = None
    socket: int | None = None
    die: int | None = None
    l3: int | None = None


@dataclass(frozen=True, slots=True)
class HugePages:
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: frozenset[int]  # online CPUs only
    memory_bytes: int
    hugepages: Mapping[int, HugePages] = field(default_factory=dict)  # page size in KiB →
    distances: Mapping[int, int] = field(default_factory=dict)  # other node id (self too) → SLIT

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", frozenset(self.cpus))
        object.__setattr__(self, "hugepages", _frozen(self.hugepages))
        object.__setattr__(self, "distances", _frozen(self.distances))


@dataclass(frozen=True, slots=True)
class PciDevice:
    address: str  # sysfs form: dddd:bb:dd.f, lowercase
    numa_node: int | None  # None: the firmware does not say (sysfs -1)
    class_code: int
    vendor: int
    device: int
    local_cpus: frozenset[int] = frozenset()
    # The PCI functions between the host bridge and this device, host side first: a device behind
    # a PCIe switch has its root port, the switch's upstream and downstream ports here.
    bridges: tuple[str, ...] = ()
    host_bridge: str | None = None  # "pci0000:00"
    physfn: str | None = None  # the PF, for an SR-IOV VF
    virtfns: tuple[str, ...] = ()  # the VFs, for an SR-IOV PF, in virtfnN order
    driver: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_cpus", frozenset(self.local_cpus))


@dataclass(frozen=True, slots=True)
class Nic:
    name: str  # netdev name
    pci_address: str | None
    vfs: tuple[str, ...] = ()  # PCI addresses of the SR-IOV VFs of this PF
    rdma: tuple[str, ...] = ()  # RDMA devices on the same PCI function (mlx5_0)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int  # NVML's index: not stable across boots, not CUDA's; key GPUs by uuid or address
    uuid: str
    pci_address: str  # sysfs form
    numa_node: int | None
    minor: int | None = None  # /dev/nvidia<minor>
    name: str = ""
    nvswitch_links: int = 0  # active NVLinks that end on an NVSwitch
    nvlink_peers: Mapping[str, int] = field(default_factory=dict)  # other GPU address → links
    pcie: Mapping[str, str] = field(default_factory=dict)  # other GPU address → PCIE_LEVELS word

    def __post_init__(self) -> None:
        object.__setattr__(self, "nvlink_peers", _frozen(self.nvlink_peers))
        object.__setattr__(self, "pcie", _frozen(self.pcie))



def pcie_level(a: PciDevice, b: PciDevice) -> str:
    """How two devices reach each other over PCIe, in NVML's words (see PCIE_LEVELS).

    single: at most one switch between them; multiple: they share a bridge but cross several
    switches; hostbridge: share only the host bridge;
    node: different host bridges on one NUMA node; system: across the socket interconnect or
    where locality is unknown.
    """
    if a.address == b.address:
        return "internal"
    common = 0
    for x, y in zip(a.bridges, b.bridges):
        if x != y:
            break
        common += 1
    if a.host_bridge is not None and a.host_bridge == b.host_bridge:
        if common == 0:
            return "hostbridge"
        # Below the deepest shared bridge, a device behind one switch has just its downstream port.
        below = max(len(a.bridges), len(b.bridges)) - common
        return "single" if below <= 1 else "multiple"
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return "node"
    return "system"
