"""The machine for people: a tree like lstopo's, and a table with one row per NUMA node."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode, PciDevice

# PCI class (base class and subclass) → a word people recognise; bridges are left out of views.
_CLASS_NAMES = {
    0x0100: "SCSI", 0x0104: "RAID", 0x0106: "SATA", 0x0108: "NVMe", 0x0200: "Ethernet",
    0x0207: "InfiniBand", 0x0300: "VGA", 0x0302: "3D", 0x0480: "Multimedia", 0x0680: "Bridge",
    0x0b40: "Coprocessor", 0x1200: "Accelerator",
}
_HIDDEN_CLASSES = {0x0600, 0x0604, 0x0880}  # host bridges, PCI bridges, system peripherals


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def hugepage_size(size_kib: int) -> str:
    return f"{size_kib // 1024 // 1024}G" if size_kib >= 1 << 20 else f"{size_kib // 1024}M"


def _hugepages(node: NumaNode) -> str:
    return " ".join(f"{hugepage_size(k)} {v.free}/{v.total}"
                    for k, v in sorted(node.hugepages.items()) if v.total)


class _Devices:
    """Which devices hang off which NUMA node, and what to call them."""

    def __init__(self, topology: Topology) -> None:
        self.by_node: dict[int | None, list[str]] = defaultdict(list)
        gpus = {g.pci_address: g for g in topology.gpus}
        nics: dict[str, list[str]] = defaultdict(list)
        for nic in topology.nics:
            if nic.pci_address:
                nics[nic.pci_address].append(nic.name + (f" ({', '.join(nic.rdma)})" if nic.rdma else ""))
        for dev in topology.pci_devices:
            if dev.class_code >> 8 in _HIDDEN_CLASSES:
                continue
            self.by_node[dev.numa_node].append(self._label(dev, gpus.get(dev.address), nics[dev.address]))

    @staticmethod
    def _label(dev: PciDevice, gpu, nic_names: list[str]) -> str:
        kind = _CLASS_NAMES.get(dev.class_code >> 8, f"class 0x{dev.class_code:06x}")
        text = f"PCI {dev.address} {kind} [{dev.vendor:04x}:{dev.device:04x}]"
        if gpu is not None:
            text += f" GPU {gpu.index}" + (f" {gpu.name}" if gpu.name else "") + f" {gpu.uuid}"
        if nic_names:
            text += " net " + ", ".join(nic_names)
        if dev.virtfns:
            text += f" ({len(dev.virtfns)} VFs)"
        if dev.physfn:
            text += f" (VF of {dev.physfn})"
        return text


def render_tree(topology: Topology) -> str:
    online = [c for c in topology.cpus if c.online]
    total_mem = sum(n.memory_bytes for n in topology.numa_nodes)
    sockets = sorted({c.socket for c in online if c.socket is not None})
    lines = [f"Machine ({len(sockets)} packages, {len(topology.numa_nodes)} NUMA nodes, "
             f"{len(online)} CPUs, {gib(total_mem)})"]
    devices = _Devices(topology)
    nodes = {n.id: n for n in topology.numa_nodes}
    shown: set[int] = set()
    for socket in sockets:
        socket_cpus = [c for c in online if c.socket == socket]
        lines.append(f"  Package {socket} (CPUs {format_list(c.id for c in socket_cpus)})")
        for node_id in sorted({c.numa for c in socket_cpus if c.numa is not None}):
            node = nodes.get(node_id)
            first_time = node_id not in shown
            shown.add(node_id)
            lines.extend(_node_lines(node_id, node, first_time, "    ", topology.isolcpus))
            lines.extend(_cpu_lines([c for c in socket_cpus if c.numa == node_id], "      "))
            if first_time:
                lines.extend(f"      {d}" for d in devices.by_node.get(node_id, []))
        orphans = [c for c in socket_cpus if c.numa is None]
        if orphans:
            lines.append("    (no NUMA node)")
            lines.extend(_cpu_lines(orphans, "      "))
    for node in topology.numa_nodes:
        if node.id not in shown:
            lines.extend(_node_lines(node.id, node, True, "  ", topology.isolcpus))
            lines.extend(f"    {d}" for d in devices.by_node.get(node.id, []))
    unplaced = devices.by_node.get(None, [])
    if unplaced:
        lines.append("  Devices of unknown NUMA locality")
        lines.extend(f"    {d}" for d in unplaced)
    offline = [c.id for c in topology.cpus if not c.online]
    if offline:
        lines.append(f"  Offline CPUs: {format_list(offline)}")
    if topology.isolcpus:
        lines.append(f"  Isolated CPUs (isolcpus): {format_list(topology.isolcpus)}")
    lines.extend(f"  warning: {w}" for w in topology.warnings)
    return "\n".join(lines)


def _node_lines(node_id: int, node: NumaNode | None, detailed: bool, indent: str,
                isolcpus: frozenset[int] = frozenset()) -> list[str]:
    if node is None:
        return [f"{indent}NUMANode {node_id} (not in the node list)"]
    if not detailed:
        return [f"{indent}NUMANode {node_id} (continued)"]
    facts = [gib(node.memory_bytes) if node.memory_bytes else "no memory"]
    if not node.cpus:
        facts.append("no CPUs")
    if _hugepages(node):
        facts.append("hugepages " + _hugepages(node))
    if node.cpus & isolcpus:
        facts.append(f"isolated CPUs {format_list(node.cpus & isolcpus)}")
    return [f"{indent}NUMANode {node_id} ({'; '.join(facts)})"]


def _cpu_lines(cpus: list[Cpu], indent: str) -> list[str]:
    lines: list[str] = []
    by_l3: dict[int | None, list[Cpu]] = defaultdict(list)
    for c in cpus:
        by_l3[c.l3].append(c)
    for l3 in sorted(by_l3, key=lambda k: (k is None, k)):
        inner = indent
        if l3 is not None:
            lines.append(f"{indent}L3 {l3} (CPUs {format_list(c.id for c in by_l3[l3])})")
            inner = indent + "  "
        by_core: dict[int | None, list[int]] = defaultdict(list)
        for c in by_l3[l3]:
            by_core[c.core if c.core is not None else -c.id - 1].append(c.id)
        for core in sorted(by_core, key=lambda k: min(by_core[k])):
            lines.append(f"{inner}Core {min(by_core[core])}: PU {', '.join(map(str, sorted(by_core[core])))}")
    return lines


def render_table(topology: Topology) -> str:
    devices = _Devices(topology)
    gpus_by_node: dict[int | None, list[str]] = defaultdict(list)
    for g in topology.gpus:
        gpus_by_node[g.numa_node].append(str(g.index))
    nics = {n.pci_address: n.name for n in topology.nics}
    nics_by_node: dict[int | None, list[str]] = defaultdict(list)
    for dev in topology.pci_devices:
        if dev.address in nics:
            nics_by_node[dev.numa_node].append(nics[dev.address])
    isolated = topology.isolcpus
    header = ("node", "cpus", "#cpus", *(("isolated",) if isolated else ()), "memory",
              "hugepages free/total", "gpus", "nics", "pci", "distances")
    rows = [header]
    for n in topology.numa_nodes:
        rows.append((
            str(n.id), format_list(n.cpus) or "-", str(len(n.cpus)),
            *((format_list(n.cpus & isolated) or "-",) if isolated else ()), gib(n.memory_bytes),
            _hugepages(n) or "-", ",".join(gpus_by_node[n.id]) or "-",
            ",".join(sorted(nics_by_node[n.id])) or "-", str(len(devices.by_node.get(n.id, []))),
            " ".join(str(n.distances[k]) for k in sorted(n.distances)) or "-",
        ))
    unknown = len(devices.by_node.get(None, []))
    footer = [f"{unknown} PCI devices of unknown NUMA locality"] if unknown else []
    footer += [f"warning: {w}" for w in topology.warnings]
    return "\n".join(align(rows) + footer)


def align(rows: Iterable[tuple[str, ...]]) -> list[str]:
    """Rows as lines of left-aligned columns two spaces apart, trailing blanks cut."""
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
