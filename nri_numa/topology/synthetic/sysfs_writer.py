"""Topology → a sysfs tree (and fake NVML) under a root, written as a real kernel writes it.

The writer starts from a ``Topology``, never from a spec, so a machine captured with
``nri-numa topology --json`` becomes a tree as readily as a preset. What the model does not keep
(cache sizes, kernel core ids, MAC addresses) is filled in with plausible values that no reader
of ours depends on. Links are relative, so a tree still works after it is moved.

CPUs, caches and NUMA nodes are written here; PCI, network and RDMA devices and GPUs in
``sysfs_devices``, through the file writer of ``sysfs_tree``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path

from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from nri_numa.topology.synthetic.sysfs_devices import write_gpus, write_netdevs, write_pci
from nri_numa.topology.synthetic.sysfs_tree import SysfsTree, kernel_mask
from nri_numa.topology.sysfs_read import PCI_ADDRESS

_KERNEL_MAX = 8191  # NR_CPUS - 1 of distribution kernels
_DEFAULT_HUGEPAGE_KIB = 2048  # the size the HugePages_* lines of meminfo count
_L1D, _L1I, _L2, _L3_PER_CORE = "48K", "32K", "2048K", 2048  # KiB
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
_SAFE_NAME = re.compile(r"[^/\x00]{1,64}")


class WriteTreeError(ValueError):
    """A Topology that cannot be laid out as sysfs; the message names the part."""


def write_tree(topology: Topology, root: Path) -> None:
    """Write ``root/sys/…`` (and ``root/proc/…``, ``root/fake-nvml.json`` for GPUs) so that
    ``discover(root)`` returns ``topology`` again."""
    _check(topology)
    out = SysfsTree(Path(root))
    width = max((c.id for c in topology.cpus), default=0) + 1  # nr_cpu_ids sizes every mask
    _write_cpus(out, topology, width)
    _write_nodes(out, topology, width)
    _write_hugepage_totals(out, topology.numa_nodes)
    write_pci(out, topology, width)
    write_netdevs(out, topology)
    if topology.gpus:
        write_gpus(out, topology)


# --- checks ---------------------------------------------------------------------------------------


def _check(topology: Topology) -> None:
    for d in topology.pci_devices:
        if d.host_bridge is None and d.bridges:
            raise WriteTreeError(f"PCI device {d.address} has bridges above it but no host bridge, "
                                 f"so it has no place under sys/devices")
        if d.host_bridge is not None and not _HOST_BRIDGE.fullmatch(d.host_bridge):
            raise WriteTreeError(f"PCI device {d.address}: host bridge {d.host_bridge!r} is not a "
                                 f"name like pci0000:00")
        for address in (d.address, *d.bridges, *d.virtfns, *([d.physfn] if d.physfn else [])):
            if not PCI_ADDRESS.fullmatch(address):
                raise WriteTreeError(f"PCI device {d.address}: {address!r} is not a PCI address "
                                     f"like 0000:1b:00.0")
        if d.driver is not None and not _SAFE_NAME.fullmatch(d.driver):
            raise WriteTreeError(f"PCI device {d.address}: driver name {d.driver!r} is not usable")
    addresses = {d.address for d in topology.pci_devices}
    for nic in topology.nics:
        for name in (nic.name, *nic.rdma):
            if not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
                raise WriteTreeError(f"network interface name {name!r} is not usable")
        if nic.pci_address is not None and nic.pci_address not in addresses:
            raise WriteTreeError(f"NIC {nic.name} sits on PCI device {nic.pci_address}, which the "
                                 f"topology does not list")
    node_ids = [n.id for n in topology.numa_nodes]
    for node in topology.numa_nodes:
        missing = [other for other in node_ids if other not in node.distances]
        if missing and node.distances:  # none at all is "unknown", written as no distance file
            raise WriteTreeError(f"NUMA node {node.id} has no distance to node(s) {missing}")
        if node.memory_bytes % 1024:
            raise WriteTreeError(f"NUMA node {node.id}: {node.memory_bytes} bytes is not a whole "
                                 f"number of KiB, which is all meminfo can say")
    for gpu in topology.gpus:
        if gpu.pci_address not in addresses:
            raise WriteTreeError(f"GPU {gpu.index} sits on PCI device {gpu.pci_address}, which the "
                                 f"topology does not list")


# --- CPUs -----------------------------------------------------------------------------------------

_CPU = "sys/devices/system/cpu"
_NODE = "sys/devices/system/node"


class _CpuGroups:
    """The sibling sets of the online CPUs, and the kernel-style ids the model does not keep."""

    def __init__(self, online: list[Cpu]) -> None:
        self.core = self._by(online, _core_key)
        self.package = self._by(online, lambda c: c.socket)
        self.die = self._by(online, lambda c: (c.socket, c.die))
        self.l3 = self._by((c for c in online if c.l3 is not None), lambda c: c.l3)
        socket_of = {c.id: c.socket for c in online}
        self.core_index = self._dense(self.core)
        # core_id and die_id count within their package, as on x86.
        self.core_id = self._dense(self.core, lambda ids: socket_of[ids[0]])
        self.die_id = self._dense(self.die, lambda ids: socket_of[ids[0]])
        self.l3_index = self._dense(self.l3)
        core_of = {cpu: key for key, ids in self.core.items() for cpu in ids}
        self.l3_cores = {key: len({core_of[cpu] for cpu in ids}) for key, ids in self.l3.items()}

    @staticmethod
    def _by(cpus: Iterable[Cpu], key: Callable[[Cpu], Hashable]) -> dict[Hashable, list[int]]:
        out: dict[Hashable, list[int]] = defaultdict(list)
        for c in cpus:
            out[key(c)].append(c.id)
        return out

    @staticmethod
    def _dense(groups: dict[Hashable, list[int]],
               within: Callable[[list[int]], Hashable] = lambda ids: None) -> dict[Hashable, int]:
        """0, 1, 2… in the order of each group's lowest CPU, restarting for each ``within`` value."""
        counters: dict[Hashable, int] = defaultdict(int)
        out = {}
        for key in sorted(groups, key=lambda k: min(groups[k])):
            scope = within(groups[key])
            out[key] = counters[scope]
            counters[scope] += 1
        return out


def _core_key(c: Cpu) -> Hashable:
    return c.core if c.core is not None else ("cpu", c.id)


def _write_cpus(out: SysfsTree, topology: Topology, width: int) -> None:
    every = [c.id for c in topology.cpus]
    online = [c for c in topology.cpus if c.online]
    out.file(f"{_CPU}/online", format_list(c.id for c in online))
    out.file(f"{_CPU}/offline", format_list(c.id for c in topology.cpus if not c.online))
    out.file(f"{_CPU}/possible", format_list(every))
    out.file(f"{_CPU}/present", format_list(every))
    out.file(f"{_CPU}/isolated", format_list(topology.isolcpus))
    out.file(f"{_CPU}/kernel_max", _KERNEL_MAX)
    out.file("proc/cpuinfo", _cpuinfo(online))
    groups = _CpuGroups(online)
    for c in topology.cpus:
        base = f"{_CPU}/cpu{c.id}"
        if c.id != 0 or not c.online:  # x86 cannot unplug cpu0, so it has no `online` file
            out.file(f"{base}/online", int(c.online))
        if c.numa is not None:
            out.link(f"{base}/node{c.numa}", f"{_NODE}/node{c.numa}")
        if c.online:  # the kernel removes topology/ and cache/ with the CPU
            _write_cpu_topology(out, f"{base}/topology", c, groups, width)
            _write_caches(out, f"{base}/cache", c, groups, width)


def _cpuinfo(online: list[Cpu]) -> str:
    """/proc/cpuinfo with the fields that do not need a CPU model; hwloc's tools take a folder
    for a system root only when it has proc/."""
    return "\n".join(f"processor\t: {c.id}\nphysical id\t: {-1 if c.socket is None else c.socket}\n"
                     for c in online)


def _write_cpu_topology(out: SysfsTree, folder: str, c: Cpu, groups: _CpuGroups, width: int) -> None:
    """Each group the model leaves unknown (None) is left out, as older kernels leave it out."""
    lists: list[tuple[str, list[int]]] = []
    if c.socket is not None:
        out.file(f"{folder}/physical_package_id", c.socket)
        package = groups.package[c.socket]
        lists += [("package_cpus", package), ("core_siblings", package)]
    if c.die is not None:
        out.file(f"{folder}/die_id", groups.die_id[(c.socket, c.die)])
        lists.append(("die_cpus", groups.die[(c.socket, c.die)]))
    if c.core is not None:
        out.file(f"{folder}/core_id", groups.core_id[c.core])
        out.file(f"{folder}/cluster_id", groups.core_index[c.core])
        lists += [("core_cpus", groups.core[c.core]), ("thread_siblings", groups.core[c.core])]
    # Lists for our readers, masks for hwloc (which reads only masks). cluster_* is left out:
    # with one core per cluster it says nothing, and a 1024-CPU tree pays for every file.
    for name, ids in lists:
        out.file(f"{folder}/{name}_list", format_list(ids))
        out.file(f"{folder}/{name}", kernel_mask(ids, width))


def _write_caches(out: SysfsTree, folder: str, c: Cpu, groups: _CpuGroups, width: int) -> None:
    core = groups.core[_core_key(c)]
    core_index = groups.core_index[_core_key(c)]
    caches = [(1, "Data", _L1D, core, core_index), (1, "Instruction", _L1I, core, core_index),
              (2, "Unified", _L2, core, core_index)]
    if c.l3 is not None:
        size = f"{_L3_PER_CORE * groups.l3_cores[c.l3]}K"
        caches.append((3, "Unified", size, groups.l3[c.l3], groups.l3_index[c.l3]))
    for k, (level, kind, size, shared, cache_id) in enumerate(caches):
        d = f"{folder}/index{k}"
        out.file(f"{d}/level", level)
        out.file(f"{d}/type", kind)
        out.file(f"{d}/size", size)
        out.file(f"{d}/shared_cpu_list", format_list(shared))
        out.file(f"{d}/shared_cpu_map", kernel_mask(shared, width))
        out.file(f"{d}/id", cache_id)


# --- NUMA nodes and hugepages ---------------------------------------------------------------------


def _write_nodes(out: SysfsTree, topology: Topology, width: int) -> None:
    nodes = topology.numa_nodes  # ascending id: the column order of every `distance` row
    ids = [n.id for n in nodes]
    out.file(f"{_NODE}/online", format_list(ids))
    out.file(f"{_NODE}/possible", format_list(ids))
    out.file(f"{_NODE}/has_cpu", format_list(n.id for n in nodes if n.cpus))
    out.file(f"{_NODE}/has_memory", format_list(n.id for n in nodes if n.memory_bytes))
    out.file(f"{_NODE}/has_normal_memory", format_list(n.id for n in nodes if n.memory_bytes))
    for node in nodes:
        base = f"{_NODE}/node{node.id}"
        out.file(f"{base}/cpulist", format_list(node.cpus))
        out.file(f"{base}/cpumap", kernel_mask(node.cpus, width))
        if node.distances:
            out.file(f"{base}/distance", " ".join(str(node.distances[other]) for other in ids))
        out.file(f"{base}/meminfo", _meminfo(node))
        for size, pages in node.hugepages.items():
            folder = f"{base}/hugepages/hugepages-{size}kB"
            out.file(f"{folder}/nr_hugepages", pages.total)
            out.file(f"{folder}/free_hugepages", pages.free)
            out.file(f"{folder}/surplus_hugepages", 0)


def _meminfo(node: NumaNode) -> str:
    """The lines readers use, in the kernel's layout (node_read_meminfo)."""
    total_kib = node.memory_bytes // 1024
    reserved_kib = sum(size * pages.total for size, pages in node.hugepages.items())
    free_kib = max(total_kib - reserved_kib, 0) * 9 // 10  # a booted machine uses some memory
    default = node.hugepages.get(_DEFAULT_HUGEPAGE_KIB)
    total, free = (default.total, default.free) if default else (0, 0)
    n = node.id
    return "\n".join((
        f"Node {n} MemTotal:       {total_kib:8d} kB",
        f"Node {n} MemFree:        {free_kib:8d} kB",
        f"Node {n} MemUsed:        {total_kib - free_kib:8d} kB",
        f"Node {n} HugePages_Total: {total:5d}",
        f"Node {n} HugePages_Free:  {free:5d}",
        f"Node {n} HugePages_Surp:  {0:5d}",
    ))


def _write_hugepage_totals(out: SysfsTree, nodes: Iterable[NumaNode]) -> None:
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for node in nodes:
        for size, pages in node.hugepages.items():
            totals[size][0] += pages.total
            totals[size][1] += pages.free
    for size, (total, free) in totals.items():
        folder = f"sys/kernel/mm/hugepages/hugepages-{size}kB"
        out.file(f"{folder}/nr_hugepages", total)
        out.file(f"{folder}/free_hugepages", free)
        out.file(f"{folder}/surplus_hugepages", 0)
        out.file(f"{folder}/resv_hugepages", 0)
