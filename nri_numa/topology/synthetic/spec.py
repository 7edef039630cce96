"""A machine described in a few numbers: the input of ``build_topology``.

Every spec value checks itself when made, so a bad description fails at once with a
``SpecError`` that names the field, rather than later as a strange tree. NUMA nodes, GPUs and
NICs refer to nodes by their kernel id (what ``numactl`` prints), which is the node's position
(socket-major) unless ``MachineSpec.node_ids`` renames them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

GIB = 1 << 30
HUGEPAGE_SIZES_KIB = (2048, 1048576)  # x86: every node has a folder for both sizes


class SpecError(ValueError):
    """A machine description that cannot be built; the message names the field."""


class Numbering(StrEnum):
    """How the kernel numbers the first thread of each core across NUMA nodes."""

    CONTIGUOUS = "contiguous"  # node 0 gets the first cores, node 1 the next…
    INTERLEAVED = "interleaved"  # SNC: inside a socket its sub-nodes take turns (``interleave``)
    ROUND_ROBIN = "round-robin"  # core k goes to node ``round_robin_order[k % nodes]``


class SmtLayout(StrEnum):
    """Where a core's other hardware threads sit in the CPU numbering."""

    OFFSET = "offset"  # thread t of core k is k + t × (all cores): x86 firmware's default
    ADJACENT = "adjacent"  # core k has CPUs k×T … k×T+T-1: many ARM machines, some BIOSes


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SpecError(message)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class DistanceSpec:
    """SLIT distances: 10 to itself, ``sibling`` to nodes of the same socket, ``remote`` across.

    ``matrix`` (rows and columns in ascending node id, CPU-less nodes included) replaces the rule.
    """

    sibling: int = 11
    remote: int = 21
    matrix: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("sibling", "remote"):
            value = getattr(self, name)
            _require(_is_count(value) and 10 < value <= 255,
                     f"distances.{name} must be an integer in 11..255, not {value!r}")
        if self.matrix is not None:
            object.__setattr__(self, "matrix", tuple(tuple(row) for row in self.matrix))
            for i, row in enumerate(self.matrix):
                _require(len(row) == len(self.matrix),
                         f"distances.matrix row {i} has {len(row)} entries; the matrix must be square")
                _require(row[i] == 10, f"distances.matrix[{i}][{i}] must be 10 (local), not {row[i]}")
                for j, value in enumerate(row):
                    _require(_is_count(value) and 10 <= value <= 255,
                             f"distances.matrix[{i}][{j}] must be an integer in 10..255, not {value!r}")


@dataclass(frozen=True, slots=True)
class MemorySpec:
    """Memory of every CPU node; hugepages are page size in KiB → pages, all free at boot."""

    bytes_per_node: int = 64 * GIB
    hugepages: Mapping[int, int] = field(default_factory=dict)
    memoryless_nodes: frozenset[int] = frozenset()  # node ids with CPUs but no memory

    def __post_init__(self) -> None:
        object.__setattr__(self, "hugepages", MappingProxyType(dict(self.hugepages)))
        object.__setattr__(self, "memoryless_nodes", frozenset(self.memoryless_nodes))
        _check_memory(self.bytes_per_node, self.hugepages, "memory")


def _check_memory(n_bytes: int, hugepages: Mapping[int, int], where: str) -> None:
    # Nodes report memory in kB (`Node 0 MemTotal: … kB`), so anything finer cannot round-trip.
    _require(_is_count(n_bytes) and n_bytes % 1024 == 0,
             f"{where}: memory must be a whole number of KiB, not {n_bytes!r} bytes")
    for size, count in hugepages.items():
        _require(size in HUGEPAGE_SIZES_KIB,
                 f"{where}: hugepage size {size!r} KiB is not one of {HUGEPAGE_SIZES_KIB}")
        _require(_is_count(count), f"{where}: hugepages[{size}] must be a count, not {count!r}")
    reserved = sum(size * 1024 * count for size, count in hugepages.items())
    _require(reserved <= n_bytes,
             f"{where}: hugepages take {reserved} bytes, more than the node's {n_bytes}")


@dataclass(frozen=True, slots=True)
class CpulessNodeSpec:
    """A node with memory and no CPUs (GPU memory, CXL, HBM), placed by its distances."""

    id: int
    memory_bytes: int
    near_node: int  # the CPU node it hangs off
    near_distance: int = 80
    far_distance: int = 120  # to every other node, CPU-less ones included
    hugepages: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hugepages", MappingProxyType(dict(self.hugepages)))
        where = f"CPU-less node {self.id}"
        _require(_is_count(self.id), f"CPU-less node id must be a non-negative integer, not {self.id!r}")
        _check_memory(self.memory_bytes, self.hugepages, where)
        for name in ("near_distance", "far_distance"):
            value = getattr(self, name)
            _require(_is_count(value) and 10 < value <= 255,
                     f"{where}: {name} must be an integer in 11..255, not {value!r}")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str = "NVIDIA H100 80GB HBM3"
    device: int = 0x2330
    nvswitch_links: int = 0
    minor: int | None = None  # /dev/nvidia<minor>; None: the GPU's index

    def __post_init__(self) -> None:
        _require(_is_count(self.nvswitch_links),
                 f"GPU {self.name!r}: nvswitch_links must be a count, not {self.nvswitch_links!r}")
        _require(self.minor is None or (_is_count(self.minor) and self.minor < 254),
                 f"GPU {self.name!r}: minor must be in 0..253 (254, 255 are the driver's), "
                 f"not {self.minor!r}")


class NicKind(StrEnum):
    ETHERNET = "ethernet"
    INFINIBAND = "infiniband"


@dataclass(frozen=True, slots=True)
class NicSpec:
    """A Mellanox/NVIDIA ConnectX function; ``name`` None picks a predictable name from its bus."""

    kind: NicKind = NicKind.INFINIBAND
    device: int = 0x1021  # ConnectX-7
    name: str | None = None
    vfs: int = 0
    rdma: bool = True  # an mlx5_N device on the PF and on each VF

    def __post_init__(self) -> None:
        _require(isinstance(self.kind, NicKind), f"NIC kind must be a NicKind, not {self.kind!r}")
        _require(_is_count(self.vfs) and self.vfs <= 127,
                 f"NIC {self.name or ''}: vfs must be a count up to 127, not {self.vfs!r}")
        _require(self.name is None or (self.name != "" and "/" not in self.name and len(self.name) < 16),
                 f"NIC name {self.name!r} is not a valid netdev name")


@dataclass(frozen=True, slots=True)
class PcieSwitchSpec:
    """Root port → switch upstream port → one downstream port per endpoint (NICs first, then GPUs).

    Buses: the host bridge's is ``host_bus`` (None: the next free), the switch takes the next two,
    and endpoint k sits on ``host_bus + 3 + k``.
    """

    node: int
    gpus: tuple[GpuSpec, ...] = ()
    nics: tuple[NicSpec, ...] = ()
    host_bus: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "nics", tuple(self.nics))
        _require(bool(self.gpus or self.nics), f"PCIe switch on node {self.node} has no GPU or NIC")
        _require(len(self.gpus) + len(self.nics) <= 32,
                 f"PCIe switch on node {self.node}: at most 32 downstream ports")


@dataclass(frozen=True, slots=True)
class RootPortNicSpec:
    """A NIC straight on a root port of its own host bridge."""

    node: int
    nic: NicSpec = NicSpec()
    host_bus: int | None = None


@dataclass(frozen=True, slots=True)
class NvSwitchSpec:
    node: int
    device: int = 0x22A3  # NVSwitch of the H100 generation
    host_bus: int | None = None


@dataclass(frozen=True, slots=True)
class NvLinkBridgeSpec:
    """Direct NVLinks between two GPUs (by index: the order GPUs appear in the switches)."""

    gpu_a: int
    gpu_b: int
    links: int

    def __post_init__(self) -> None:
        _require(self.gpu_a != self.gpu_b, f"NVLink bridge joins GPU {self.gpu_a} to itself")
        _require(_is_count(self.links) and self.links > 0,
                 f"NVLink bridge {self.gpu_a}-{self.gpu_b}: links must be positive, not {self.links!r}")


@dataclass(frozen=True, slots=True)
class MachineSpec:
    name: str
    sockets: int
    nodes_per_socket: int
    cores_per_node: int
    threads_per_core: int = 2
    numbering: Numbering = Numbering.CONTIGUOUS
    interleave: tuple[int, ...] = (1,)  # INTERLEAVED: chunk sizes, chunk j going to sub-node j % n
    round_robin_order: tuple[int, ...] | None = None  # ROUND_ROBIN: node positions; None: 0, 1, …
    smt: SmtLayout = SmtLayout.OFFSET
    node_ids: tuple[int, ...] | None = None  # kernel id of each node position; None: 0, 1, …
    distances: DistanceSpec = DistanceSpec()
    cores_per_l3: int | None = None  # None: one L3 per socket
    memory: MemorySpec = MemorySpec()
    cpuless_nodes: tuple[CpulessNodeSpec, ...] = ()
    offline_cpus: frozenset[int] = frozenset()
    isolcpus: frozenset[int] = frozenset()
    switches: tuple[PcieSwitchSpec, ...] = ()
    root_port_nics: tuple[RootPortNicSpec, ...] = ()
    nvswitches: tuple[NvSwitchSpec, ...] = ()
    nvlink_bridges: tuple[NvLinkBridgeSpec, ...] = ()

    def __post_init__(self) -> None:
        for name in ("interleave", "cpuless_nodes", "switches", "root_port_nics", "nvswitches",
                     "nvlink_bridges"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("node_ids", "round_robin_order"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "offline_cpus", frozenset(self.offline_cpus))
        object.__setattr__(self, "isolcpus", frozenset(self.isolcpus))
        _require(bool(self.name) and "/" not in self.name, f"machine name {self.name!r} is not usable")
        for name in ("sockets", "nodes_per_socket", "cores_per_node", "threads_per_core"):
            value = getattr(self, name)
            _require(_is_count(value) and value > 0, f"{name} must be a positive integer, not {value!r}")
        _require(isinstance(self.numbering, Numbering), f"numbering must be a Numbering, not {self.numbering!r}")
        _require(isinstance(self.smt, SmtLayout), f"smt must be an SmtLayout, not {self.smt!r}")
        self._check_numbering()
        self._check_l3()
        self._check_nodes()
        self._check_cpu_sets()
        self._check_devices()

    # --- derived sizes --------------------------------------------------------------------------

    @property
    def cpu_node_count(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def core_count(self) -> int:
        return self.cpu_node_count * self.cores_per_node

    @property
    def cpu_count(self) -> int:
        return self.core_count * self.threads_per_core

    def node_id(self, position: int) -> int:
        """Kernel id of the CPU node at ``position`` (socket-major)."""
        return position if self.node_ids is None else self.node_ids[position]

    @property
    def cpu_node_ids(self) -> tuple[int, ...]:
        return tuple(self.node_id(p) for p in range(self.cpu_node_count))

    @property
    def gpus(self) -> tuple[GpuSpec, ...]:
        """Every GPU in index order: switch by switch, as listed."""
        return tuple(g for s in self.switches for g in s.gpus)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_minors(self) -> tuple[int, ...]:
        return tuple(i if g.minor is None else g.minor for i, g in enumerate(self.gpus))

    # --- checks -----------------------------------------------------------------------------------

    def _check_numbering(self) -> None:
        if self.numbering is Numbering.INTERLEAVED:
            _require(bool(self.interleave) and all(_is_count(c) and c > 0 for c in self.interleave),
                     f"interleave must be positive chunk sizes, not {self.interleave!r}")
        if self.round_robin_order is not None:
            _require(self.numbering is Numbering.ROUND_ROBIN,
                     f"round_robin_order is for round-robin numbering, not {self.numbering.value}")
            _require(sorted(self.round_robin_order) == list(range(self.cpu_node_count)),
                     f"round_robin_order must list each node position 0..{self.cpu_node_count - 1} "
                     f"once, not {self.round_robin_order!r}")

    def _check_l3(self) -> None:
        if self.cores_per_l3 is None:
            return
        per_socket = self.nodes_per_socket * self.cores_per_node
        c = self.cores_per_l3
        _require(_is_count(c) and c > 0 and per_socket % c == 0,
                 f"cores_per_l3 ({c!r}) must divide the {per_socket} cores of a socket")
        _require(self.cores_per_node % c == 0 or c % self.cores_per_node == 0,
                 f"cores_per_l3 ({c}) must divide or be a multiple of cores_per_node "
                 f"({self.cores_per_node}) so that no L3 straddles part of a node")

    def _check_nodes(self) -> None:
        if self.node_ids is not None:
            _require(len(self.node_ids) == self.cpu_node_count,
                     f"node_ids has {len(self.node_ids)} ids for {self.cpu_node_count} CPU nodes")
            _require(all(_is_count(i) for i in self.node_ids), f"node_ids must be non-negative: {self.node_ids!r}")
        cpu_nodes = self.cpu_node_ids
        all_ids = list(cpu_nodes) + [n.id for n in self.cpuless_nodes]
        _require(len(set(all_ids)) == len(all_ids), f"NUMA node ids repeat: {sorted(all_ids)}")
        for n in self.cpuless_nodes:
            _require(n.near_node in cpu_nodes, f"CPU-less node {n.id}: near_node {n.near_node} is not a CPU node")
        unknown = self.memory.memoryless_nodes - set(cpu_nodes)
        _require(not unknown, f"memory.memoryless_nodes names nodes that are not CPU nodes: {sorted(unknown)}")
        if self.distances.matrix is not None:
            _require(len(self.distances.matrix) == len(all_ids),
                     f"distances.matrix is {len(self.distances.matrix)}×{len(self.distances.matrix)} "
                     f"for {len(all_ids)} NUMA nodes")

    def _check_cpu_sets(self) -> None:
        for name in ("offline_cpus", "isolcpus"):
            outside = {c for c in getattr(self, name) if not _is_count(c) or c >= self.cpu_count}
            _require(not outside, f"{name} has CPUs outside 0..{self.cpu_count - 1}: {sorted(map(str, outside))}")
        _require(not self.offline_cpus or len(self.offline_cpus) < self.cpu_count, "offline_cpus takes every CPU")
        both = self.offline_cpus & self.isolcpus
        _require(not both, f"CPUs both offline and isolated: {sorted(both)}")

    def _check_devices(self) -> None:
        cpu_nodes = set(self.cpu_node_ids)
        placed = [("PCIe switch", s.node) for s in self.switches]
        placed += [("root-port NIC", n.node) for n in self.root_port_nics]
        placed += [("NVSwitch", n.node) for n in self.nvswitches]
        for what, node in placed:
            _require(node in cpu_nodes, f"{what} on node {node}: not a CPU node of this machine")
        for bridge in self.nvlink_bridges:
            for gpu in (bridge.gpu_a, bridge.gpu_b):
                _require(0 <= gpu < self.gpu_count,
                         f"NVLink bridge names GPU {gpu}; this machine has {self.gpu_count} GPUs")
        minors = self.gpu_minors
        _require(len(set(minors)) == len(minors), f"GPU minors repeat: {sorted(minors)}")
        names = [n.name for n in self._all_nics() if n.name is not None]
        _require(len(set(names)) == len(names), f"NIC names repeat: {sorted(names)}")

    def _all_nics(self) -> list[NicSpec]:
        return [n for s in self.switches for n in s.nics] + [r.nic for r in self.root_port_nics]
