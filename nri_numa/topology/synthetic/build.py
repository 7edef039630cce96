"""MachineSpec → Topology: CPUs and their groups, NUMA nodes and distances, PCI devices.

PCI layout: every GPU switch, root-port NIC and NVSwitch gets a host bridge of its own
(``pci0000:BB``) with one root port at ``BB:01.0``; a switch hangs its upstream port on the next bus
and one downstream port per endpoint on the bus after. SR-IOV VFs share their PF's bus, numbered
after it as ARI does. Every device below a root port is local to the root port's node.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from nri_numa.topology.model import Topology
from nri_numa.topology.nvml import NVSWITCH_CLASS
from nri_numa.topology.parts import Cpu, Gpu, HugePages, Nic, NumaNode, PciDevice, pcie_level
from nri_numa.topology.synthetic.spec import (
    HUGEPAGE_SIZES_KIB,
    MachineSpec,
    NicKind,
    NicSpec,
    Numbering,
    SmtLayout,
    SpecError,
)


@dataclass(frozen=True, slots=True)
class _Core:
    cpus: tuple[int, ...]  # its hardware threads, first thread first
    socket: int
    node: int  # node position (socket-major), not the kernel id
    l3: int  # L3 group, numbered machine-wide


def build_topology(spec: MachineSpec) -> Topology:
    """The machine ``spec`` describes, as discovery would report it."""
    cores = _cores(spec)
    cpus = _cpus(spec, cores)
    nodes = _numa_nodes(spec, cpus)
    node_cpus = {n.id: n.cpus for n in nodes}
    pci_devices, nics, gpus = build_devices(spec, node_cpus)
    return Topology(cpus=cpus, numa_nodes=nodes, isolcpus=spec.isolcpus, pci_devices=pci_devices,
                    nics=nics, gpus=gpus)


# --- CPUs ---------------------------------------------------------------------------------------


def _cores(spec: MachineSpec) -> list[_Core]:
    """Core k is the core whose first thread is the k-th in numbering order."""
    positions = _core_node_positions(spec)
    placed = [(k, pos // spec.nodes_per_socket, pos) for k, pos in enumerate(positions)]
    l3_of = _l3_groups(spec, placed)
    return [_Core(_threads(spec, k), socket, pos, l3_of[k]) for k, socket, pos in placed]


def _core_node_positions(spec: MachineSpec) -> list[int]:
    nodes = spec.cpu_node_count
    if spec.numbering is Numbering.ROUND_ROBIN:
        order = spec.round_robin_order or tuple(range(nodes))
        return [order[k % nodes] for k in range(spec.core_count)]
    if spec.numbering is Numbering.INTERLEAVED:
        per_socket = _interleaved_sub_nodes(spec)
        return [socket * spec.nodes_per_socket + sub
                for socket in range(spec.sockets) for sub in per_socket]
    return [k // spec.cores_per_node for k in range(spec.core_count)]


def _interleaved_sub_nodes(spec: MachineSpec) -> list[int]:
    """Sub-node of each core of one socket: chunk j goes to sub-node j % n; a full node skips its turn."""
    n, want = spec.nodes_per_socket, spec.cores_per_node
    taken = [0] * n
    out: list[int] = []
    turn = 0
    while len(out) < n * want:
        sub = turn % n
        size = min(spec.interleave[turn % len(spec.interleave)], want - taken[sub])
        out.extend([sub] * size)
        taken[sub] += size
        turn += 1
    return out


def _threads(spec: MachineSpec, k: int) -> tuple[int, ...]:
    t = spec.threads_per_core
    if spec.smt is SmtLayout.ADJACENT:
        return tuple(k * t + i for i in range(t))
    return tuple(k + i * spec.core_count for i in range(t))


def _l3_groups(spec: MachineSpec, placed: list[tuple[int, int, int]]) -> dict[int, int]:
    """Core → L3 group: each socket's cores in node order, cut into runs of ``cores_per_l3``."""
    size = spec.cores_per_l3 or spec.nodes_per_socket * spec.cores_per_node
    by_socket: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for k, socket, pos in placed:
        by_socket[socket].append((pos, k))
    groups: dict[int, int] = {}
    group = 0
    for socket in sorted(by_socket):
        for i, (_, k) in enumerate(sorted(by_socket[socket])):
            groups[k] = group + i // size
        group += len(by_socket[socket]) // size
    return groups


def _cpus(spec: MachineSpec, cores: list[_Core]) -> tuple[Cpu, ...]:
    """Group ids are the lowest *online* CPU of the group, as the kernel drops offline CPUs
    from every sibling list."""
    def online(cpus: tuple[int, ...]) -> list[int]:
        return [c for c in cpus if c not in spec.offline_cpus]

    socket_cpus: dict[int, list[int]] = defaultdict(list)
    l3_cpus: dict[int, list[int]] = defaultdict(list)
    for core in cores:
        socket_cpus[core.socket].extend(online(core.cpus))
        l3_cpus[core.l3].extend(online(core.cpus))
    out = []
    for core in cores:
        node = spec.node_id(core.node)
        for cpu in core.cpus:
            if cpu in spec.offline_cpus:
                out.append(Cpu(cpu, node, online=False))
                continue
            out.append(Cpu(cpu, node, core=min(online(core.cpus)), socket=core.socket,
                           die=min(socket_cpus[core.socket]), l3=min(l3_cpus[core.l3])))
    return tuple(out)


# --- NUMA nodes ---------------------------------------------------------------------------------


def _numa_nodes(spec: MachineSpec, cpus: tuple[Cpu, ...]) -> tuple[NumaNode, ...]:
    node_cpus: dict[int, set[int]] = defaultdict(set)
    for cpu in cpus:
        if cpu.online:
            node_cpus[cpu.numa].add(cpu.id)
    distances = _distances(spec)
    nodes = []
    for node in spec.cpu_node_ids:
        memoryless = node in spec.memory.memoryless_nodes
        memory = 0 if memoryless else spec.memory.bytes_per_node
        pages = {} if memoryless else spec.memory.hugepages
        nodes.append(NumaNode(node, frozenset(node_cpus[node]), memory, _hugepages(pages),
                              distances[node]))
    for extra in spec.cpuless_nodes:
        nodes.append(NumaNode(extra.id, frozenset(), extra.memory_bytes, _hugepages(extra.hugepages),
                              distances[extra.id]))
    return tuple(nodes)


def _hugepages(counts: Mapping[int, int]) -> dict[int, HugePages]:
    # A fresh boot: every page reserved is still free. Both sizes appear, as on x86 kernels.
    return {size: HugePages(counts.get(size, 0), counts.get(size, 0)) for size in HUGEPAGE_SIZES_KIB}


def _distances(spec: MachineSpec) -> dict[int, dict[int, int]]:
    ids = sorted(list(spec.cpu_node_ids) + [n.id for n in spec.cpuless_nodes])
    if spec.distances.matrix is not None:
        return {a: {b: spec.distances.matrix[i][j] for j, b in enumerate(ids)} for i, a in enumerate(ids)}
    return {a: {b: _rule_distance(spec, a, b) for b in ids} for a in ids}


def _rule_distance(spec: MachineSpec, a: int, b: int) -> int:
    if a == b:
        return 10
    cpuless = {n.id: n for n in spec.cpuless_nodes}
    if a in cpuless and b in cpuless:
        return max(cpuless[a].far_distance, cpuless[b].far_distance)
    if a in cpuless or b in cpuless:
        extra, other = (cpuless[a], b) if a in cpuless else (cpuless[b], a)
        return extra.near_distance if extra.near_node == other else extra.far_distance
    position = {node: p for p, node in enumerate(spec.cpu_node_ids)}
    same_socket = position[a] // spec.nodes_per_socket == position[b] // spec.nodes_per_socket
    return spec.distances.sibling if same_socket else spec.distances.remote


# --- PCI devices --------------------------------------------------------------------------------

_BRIDGE_CLASS = 0x060400
_ROOT_PORT = (0x8086, 0x352A)  # a Xeon root port
_SWITCH_PORT = (0x1000, 0xC030)  # a Broadcom PEX89000 PCIe switch, both port kinds
_NVIDIA = 0x10DE
_GPU_CLASS = 0x030200
_MELLANOX = 0x15B3
_MLX5_VF = 0x101E  # every ConnectX generation's VF
_NIC_CLASS = {NicKind.ETHERNET: 0x020000, NicKind.INFINIBAND: 0x020700}
_FIRST_AUTO_BUS = 0x10
_LAST_BUS = 0xFF


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where an endpoint goes: its bus and the bridges above it."""

    node: int
    bus: int
    host_bridge: str
    bridges: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _PlacedNic:
    spec: NicSpec
    pf: str
    vfs: tuple[str, ...]


def _address(bus: int, devfn: int = 0) -> str:
    return f"0000:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def _bus_of(address: str) -> int:
    return int(address.split(":")[1], 16)


def _host_buses(spec: MachineSpec) -> list[int]:
    """Host bridge bus of each switch, root-port NIC and NVSwitch, in that order."""
    wants = [(s.host_bus, 3 + len(s.gpus) + len(s.nics)) for s in spec.switches]
    wants += [(n.host_bus, 2) for n in spec.root_port_nics]
    wants += [(n.host_bus, 2) for n in spec.nvswitches]
    used: set[int] = set()

    def take(first: int, size: int) -> None:
        span = set(range(first, first + size))
        if first + size - 1 > _LAST_BUS or span & used:
            raise SpecError(f"PCI buses 0x{first:02x}-0x{first + size - 1:02x} are taken or beyond 0xff")
        used.update(span)

    for bus, size in wants:
        if bus is not None:
            take(bus, size)
    out = []
    for bus, size in wants:
        if bus is None:
            bus = next((b for b in range(_FIRST_AUTO_BUS, _LAST_BUS + 2 - size)
                        if not set(range(b, b + size)) & used), _LAST_BUS + 1)
            take(bus, size)
        out.append(bus)
    return out


class _PciBuilder:
    def __init__(self, node_cpus: Mapping[int, frozenset[int]]) -> None:
        self.node_cpus = node_cpus
        self.devices: dict[str, PciDevice] = {}

    def add(self, slot: _Slot, devfn: int, class_code: int, ids: tuple[int, int], driver: str,
            physfn: str | None = None) -> str:
        address = _address(slot.bus, devfn)
        self.devices[address] = PciDevice(
            address, slot.node, class_code, ids[0], ids[1], self.node_cpus[slot.node], slot.bridges,
            slot.host_bridge, physfn=physfn, driver=driver)
        return address

    def root_port(self, node: int, host_bus: int) -> _Slot:
        host = _Slot(node, host_bus, f"pci0000:{host_bus:02x}", ())
        port = self.add(host, 0x08, _BRIDGE_CLASS, _ROOT_PORT, "pcieport")  # device 01, function 0
        return _Slot(node, host_bus + 1, host.host_bridge, (port,))

    def switch(self, node: int, host_bus: int, endpoints: int) -> list[_Slot]:
        below_root = self.root_port(node, host_bus)
        upstream = self.add(below_root, 0, _BRIDGE_CLASS, _SWITCH_PORT, "pcieport")
        ports = _Slot(node, host_bus + 2, below_root.host_bridge, below_root.bridges + (upstream,))
        slots = []
        for k in range(endpoints):
            downstream = self.add(ports, k << 3, _BRIDGE_CLASS, _SWITCH_PORT, "pcieport")
            slots.append(_Slot(node, host_bus + 3 + k, ports.host_bridge, ports.bridges + (downstream,)))
        return slots

    def nic(self, nic: NicSpec, slot: _Slot) -> _PlacedNic:
        ids = (_MELLANOX, nic.device)
        pf = self.add(slot, 0, _NIC_CLASS[nic.kind], ids, "mlx5_core")
        vfs = tuple(self.add(slot, 1 + i, _NIC_CLASS[nic.kind], (_MELLANOX, _MLX5_VF), "mlx5_core", physfn=pf)
                    for i in range(nic.vfs))
        self.devices[pf] = _with_virtfns(self.devices[pf], vfs)
        return _PlacedNic(nic, pf, vfs)


def _with_virtfns(device: PciDevice, vfs: tuple[str, ...]) -> PciDevice:
    return PciDevice(device.address, device.numa_node, device.class_code, device.vendor, device.device,
                     device.local_cpus, device.bridges, device.host_bridge, virtfns=vfs,
                     driver=device.driver)


def build_devices(spec: MachineSpec, node_cpus: Mapping[int, frozenset[int]]
                  ) -> tuple[tuple[PciDevice, ...], tuple[Nic, ...], tuple[Gpu, ...]]:
    pci = _PciBuilder(node_cpus)
    hosts = iter(_host_buses(spec))
    placed_nics: list[_PlacedNic] = []
    gpu_addresses: list[str] = []
    for switch in spec.switches:
        slots = pci.switch(switch.node, next(hosts), len(switch.nics) + len(switch.gpus))
        placed_nics += [pci.nic(nic, slot) for nic, slot in zip(switch.nics, slots)]
        gpu_addresses += [pci.add(slot, 0, _GPU_CLASS, (_NVIDIA, gpu.device), "nvidia")
                          for gpu, slot in zip(switch.gpus, slots[len(switch.nics):])]
    for rp_nic in spec.root_port_nics:
        placed_nics.append(pci.nic(rp_nic.nic, pci.root_port(rp_nic.node, next(hosts))))
    for nvswitch in spec.nvswitches:
        slot = pci.root_port(nvswitch.node, next(hosts))
        pci.add(slot, 0, NVSWITCH_CLASS, (_NVIDIA, nvswitch.device), "nvidia-nvswitch")
    nics = _nics(placed_nics)
    gpus = _gpus(spec, gpu_addresses, pci.devices)
    return tuple(pci.devices.values()), nics, gpus


def _nics(placed: list[_PlacedNic]) -> tuple[Nic, ...]:
    """Netdev names follow systemd's predictable scheme; mlx5_N counts PFs, then VFs, by address."""
    with_rdma = sorted(p.pf for p in placed if p.spec.rdma)
    with_rdma += sorted(vf for p in placed if p.spec.rdma for vf in p.vfs)
    rdma = {address: (f"mlx5_{i}",) for i, address in enumerate(with_rdma)}
    out = []
    for p in placed:
        name = p.spec.name or _predictable_name(p.spec.kind, _bus_of(p.pf))
        out.append(Nic(name, p.pf, p.vfs, rdma.get(p.pf, ())))
        out += [Nic(f"{name}v{i}", vf, (), rdma.get(vf, ())) for i, vf in enumerate(p.vfs)]
    names = [n.name for n in out]
    if len(set(names)) != len(names):
        raise SpecError(f"NIC names repeat: {sorted(names)}")
    return tuple(out)


def _predictable_name(kind: NicKind, bus: int) -> str:
    return f"ibp{bus}s0" if kind is NicKind.INFINIBAND else f"enp{bus}s0f0np0"


def _gpus(spec: MachineSpec, addresses: list[str], devices: Mapping[str, PciDevice]) -> tuple[Gpu, ...]:
    specs = spec.gpus
    direct: dict[tuple[int, int], int] = defaultdict(int)
    for bridge in spec.nvlink_bridges:
        direct[(bridge.gpu_a, bridge.gpu_b)] += bridge.links
        direct[(bridge.gpu_b, bridge.gpu_a)] += bridge.links
    out = []
    for i, (gpu, address) in enumerate(zip(specs, addresses)):
        peers = {}
        for j, other in enumerate(specs):
            links = direct[(i, j)]
            if i != j and gpu.nvswitch_links and other.nvswitch_links:
                links += min(gpu.nvswitch_links, other.nvswitch_links)
            if i != j and links:
                peers[addresses[j]] = links
        pcie = {other: pcie_level(devices[address], devices[other]) for other in addresses if other != address}
        out.append(Gpu(i, gpu_uuid(spec.name, i), address, devices[address].numa_node,
                       minor=spec.gpu_minors[i], name=gpu.name, nvswitch_links=gpu.nvswitch_links,
                       nvlink_peers=peers, pcie=pcie))
    return tuple(out)


def gpu_uuid(machine: str, index: int) -> str:
    """Stable across runs, distinct across machines, in NVML's ``GPU-<uuid>`` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'nri-numa:synthetic:{machine}:gpu{index}')}"
