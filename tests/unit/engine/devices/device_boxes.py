"""Hand-built machines for the device provider tests.

* ``dgx_h100`` — 8 GPUs, 4 per NUMA node, each with 18 NVLinks into the NVSwitch fabric; each GPU
  behind its own PCIe switch together with one NIC; two storage NICs behind one more switch on
  node 0 (public DGX H100 topology reports).
* ``pcie_box`` — 4 GPUs without NVLink: GPUs 0,1 behind one PCIe switch, 2,3 behind another, both
  switches under one host bridge of node 0.
* ``nvlink_pairs`` — 4 GPUs on one node: 0-1 joined by 4 NVLinks, 2-3 by 2, 1-2 by 1.
* ``dgx1_volta`` — the DGX-1 (Volta) facts NVIDIA's allocator tests use: the hybrid cube-mesh
  NVLink counts and the PCIe levels, as tables (our transcription).
* ``dgx_a100_like`` — 4 GPUs of one node, two per PCIe switch, two NICs per switch.
* ``hgx16`` — 16 GPUs on 2 nodes, 6 NVSwitch links each; PCIe: pairs on a switch, quads under
  one root port, 8 per host bridge.
"""

from __future__ import annotations

from collections.abc import Mapping

from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, Nic, NumaNode, PciDevice, pcie_level

GPU_CLASS, NIC_CLASS, BRIDGE_CLASS = 0x030200, 0x020000, 0x060400


def numa_nodes(count: int) -> tuple[tuple[Cpu, ...], tuple[NumaNode, ...]]:
    cpus = tuple(Cpu(id=c, numa=c // 4, core=c, socket=c // 4) for c in range(4 * count))
    nodes = tuple(NumaNode(id=n, cpus=frozenset(range(4 * n, 4 * n + 4)), memory_bytes=1 << 34,
                           distances={m: 10 if m == n else 21 for m in range(count)})
                  for n in range(count))
    return cpus, nodes


def pci(address: str, node: int | None, bridges: tuple[str, ...], host_bridge: str | None,
        class_code: int = GPU_CLASS) -> PciDevice:
    return PciDevice(address=address, numa_node=node, class_code=class_code, vendor=0x10DE,
                     device=0x2330, bridges=bridges, host_bridge=host_bridge)


def gpus_from_pci(devices: list[PciDevice], *, nvswitch_links: int = 0,
                  nvlinks: Mapping[tuple[int, int], int] | None = None) -> tuple[Gpu, ...]:
    """GPUs over PCI functions, their PCIe levels taken from the PCI tree."""
    links = nvlinks or {}
    gpus = []
    for i, d in enumerate(devices):
        peers = {o.address: n for j, o in enumerate(devices)
                 for n in [links.get((i, j)) or links.get((j, i))] if n}
        gpus.append(Gpu(index=i, uuid=f"GPU-{i:04d}", pci_address=d.address,
                        numa_node=d.numa_node, minor=i, nvswitch_links=nvswitch_links,
                        nvlink_peers=peers,
                        pcie={o.address: pcie_level(d, o) for o in devices if o is not d}))
    return tuple(gpus)


def behind_switch(address: str, node: int, root_port: str, switch: str, host_bridge: str,
                  class_code: int = GPU_CLASS) -> PciDevice:
    """A device behind a PCIe switch: root port, switch upstream port, one downstream port."""
    return pci(address, node, (root_port, f"{switch}.0", f"{switch}.{address[5:7]}"),
               host_bridge, class_code)


DGX_H100_BUSES = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]


def dgx_h100() -> Topology:
    gpu_pci, nic_pci, nics = [], [], []
    for i, bus in enumerate(DGX_H100_BUSES):
        node, switch = i // 4, f"0000:{int(bus, 16) - 3:02x}:00"
        host = f"pci0000:{int(bus, 16) - 5:02x}"
        root = f"0000:{int(bus, 16) - 5:02x}:01.0"
        gpu_pci.append(behind_switch(f"0000:{bus}:00.0", node, root, switch, host))
        nic_address = f"0000:{int(bus, 16) - 1:02x}:00.0"
        nic_pci.append(behind_switch(nic_address, node, root, switch, host, NIC_CLASS))
        nics.append(Nic(name=f"ibp{i}", pci_address=nic_address, rdma=(f"mlx5_{i}",)))
    for j, address in enumerate(["0000:aa:00.0", "0000:aa:00.1"]):
        nic_pci.append(behind_switch(address, 0, "0000:a8:01.0", "0000:a9:00", "pci0000:a8",
                                     NIC_CLASS))
        nics.append(Nic(name=f"storage{j}", pci_address=address, rdma=(f"mlx5_{8 + j}",)))
    cpus, nodes = numa_nodes(2)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=(*gpu_pci, *nic_pci),
                    nics=tuple(nics), gpus=gpus_from_pci(gpu_pci, nvswitch_links=18))


def pcie_box() -> Topology:
    devices = [behind_switch(f"0000:{bus}:00.0", 0, f"0000:00:0{s}.0", f"0000:0{s + 1}:00",
                             "pci0000:00")
               for s, bus in [(1, "04"), (1, "05"), (3, "08"), (3, "09")]]
    cpus, nodes = numa_nodes(2)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=tuple(devices),
                    gpus=gpus_from_pci(devices))


def nvlink_pairs() -> Topology:
    devices = [pci(f"0000:{bus}:00.0", 0, (f"0000:00:0{i + 1}.0",), "pci0000:00")
               for i, bus in enumerate(["11", "12", "13", "14"])]
    cpus, nodes = numa_nodes(2)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=tuple(devices),
                    gpus=gpus_from_pci(devices, nvlinks={(0, 1): 4, (2, 3): 2, (1, 2): 1}))


# DGX-1 Volta: NVLinks per pair, and the pairs sharing a PCIe switch; the other pairs of one
# socket (GPUs 0-3, 4-7) meet at the host bridge, pairs across sockets cross the CPU link.
DGX1_VOLTA_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1,
                      (1, 5): 2, (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1,
                      (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
DGX1_VOLTA_SWITCH_PAIRS = {(0, 1), (2, 3), (4, 5), (6, 7)}


def dgx1_volta() -> Topology:
    addresses = [f"0000:{bus:02x}:00.0" for bus in range(0x10, 0x18)]

    def level(i: int, j: int) -> str:
        if (min(i, j), max(i, j)) in DGX1_VOLTA_SWITCH_PAIRS:
            return "single"
        return "hostbridge" if i // 4 == j // 4 else "system"

    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-V{i}", pci_address=a, numa_node=i // 4,
            nvlink_peers={addresses[j]: n for (x, y), n in DGX1_VOLTA_NVLINKS.items()
                          for j in [y if x == i else x if y == i else -1] if j >= 0},
            pcie={b: level(i, j) for j, b in enumerate(addresses) if j != i})
        for i, a in enumerate(addresses))
    cpus, nodes = numa_nodes(2)
    return Topology(cpus=cpus, numa_nodes=nodes, gpus=gpus)


def dgx_a100_like() -> Topology:
    gpu_pci, nic_pci, nics = [], [], []
    for s, (root, switch) in enumerate([("0000:00:01.0", "0000:01:00"),
                                        ("0000:00:03.0", "0000:05:00")]):
        base = 0x02 + 4 * s
        for k in range(2):
            gpu_pci.append(behind_switch(f"0000:{base + k:02x}:00.0", 0, root, switch,
                                         "pci0000:00"))
            address = f"0000:{base + 2 + k:02x}:00.0"
            nic_pci.append(behind_switch(address, 0, root, switch, "pci0000:00", NIC_CLASS))
            nics.append(Nic(name=f"ib{2 * s + k}", pci_address=address))
    cpus, nodes = numa_nodes(1)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=(*gpu_pci, *nic_pci),
                    nics=tuple(nics), gpus=gpus_from_pci(gpu_pci, nvswitch_links=12))


def hgx16() -> Topology:
    devices = []
    for i in range(16):
        socket, quad, pair = i // 8, i // 4, i // 2
        devices.append(pci(f"0000:{0x20 + 8 * i:02x}:00.0", socket,
                           (f"0000:{0x10 * quad:02x}:01.0", f"quad{quad}.0", f"pair{pair}.0",
                            f"pair{pair}.{i % 2 + 1}"),
                           f"pci0000:{socket}0"))
    cpus, nodes = numa_nodes(2)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=tuple(devices),
                    gpus=gpus_from_pci(devices, nvswitch_links=6))


def addresses(topology: Topology, *indices: int) -> tuple[str, ...]:
    """PCI addresses of GPUs by NVML index, ascending."""
    by_index = {g.index: g.pci_address for g in topology.gpus}
    return tuple(sorted(by_index[i] for i in indices))


def indices(topology: Topology, chosen: tuple[str, ...] | list[str]) -> list[int]:
    by_address = {g.pci_address: g.index for g in topology.gpus}
    return sorted(by_address[a] for a in chosen)
