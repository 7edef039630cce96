"""Named machines for tests, demos and ``nri-numa --preset``: real layouts, reproduced by rule.

Where a preset follows a public dump, the layout facts (numbering, distances, buses) are those
that docs/presets.md lists with their public sources; sizes are round figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic.build import build_topology
from nri_numa.topology.synthetic.spec import (
    GIB,
    CpulessNodeSpec,
    DistanceSpec,
    GpuSpec,
    MachineSpec,
    MemorySpec,
    NicKind,
    NicSpec,
    Numbering,
    NvLinkBridgeSpec,
    NvSwitchSpec,
    PcieSwitchSpec,
    RootPortNicSpec,
)

_CONNECTX6_DX = 0x101D
_CONNECTX7 = 0x1021


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    summary: str  # one line, for listings and --help
    spec: MachineSpec


def _intel_2s_ht() -> MachineSpec:
    return MachineSpec(
        name="intel-2s-ht", sockets=2, nodes_per_socket=1, cores_per_node=24,
        distances=DistanceSpec(remote=21),
        memory=MemorySpec(384 * GIB, hugepages={2048: 4096}),
        root_port_nics=(RootPortNicSpec(0, NicSpec(NicKind.ETHERNET, _CONNECTX6_DX, "ens1f0", vfs=4)),),
    )


def _intel_2s_snc2() -> MachineSpec:
    # Xeon Gold 6248 in SNC2: each socket's 20 cores split 3,2,2,3 between its two sub-nodes,
    # which gives node0 0 1 2 5 6 10 11 12 15 16 and node1 3 4 7 8 9 13 14 17 18 19.
    return MachineSpec(
        name="intel-2s-snc2", sockets=2, nodes_per_socket=2, cores_per_node=10,
        numbering=Numbering.INTERLEAVED, interleave=(3, 2, 2, 3),
        distances=DistanceSpec(sibling=11, remote=21),
        memory=MemorySpec(96 * GIB, hugepages={2048: 1024, 1048576: 8}),
    )


# GPU i of the EPYC box hangs off node _EPYC_GPU_NODES[i] (ROCm affinity blog); each node owns a
# block of 32 buses, so PCI order (and the driver's minor) follows the node, not the GPU index.
_EPYC_GPU_NODES = (3, 2, 1, 0, 7, 6, 5, 4)


def _amd_epyc_2s_nps4() -> MachineSpec:
    switches = tuple(
        PcieSwitchSpec(node, gpus=(GpuSpec("NVIDIA A100 80GB PCIe", 0x20B5, minor=node),),
                       host_bus=0x01 + 0x20 * node)
        for node in _EPYC_GPU_NODES)
    return MachineSpec(
        name="amd-epyc-2s-nps4", sockets=2, nodes_per_socket=4, cores_per_node=16, cores_per_l3=8,
        distances=DistanceSpec(sibling=12, remote=32),
        memory=MemorySpec(128 * GIB, hugepages={2048: 2048}),
        switches=switches,
        # A100 PCIe cards bridged in pairs: three bridges of four links each.
        nvlink_bridges=tuple(NvLinkBridgeSpec(i, i + 1, 12) for i in range(0, 8, 2)),
    )


def _intel_4s() -> MachineSpec:
    # Xeon E7-4870 ×4: round-robin numbering, and the nodes are not visited in id order
    # (node0 0,4,8…, node1 2,6,10…, node2 1,5,9…, node3 3,7,11…).
    return MachineSpec(
        name="intel-4s", sockets=4, nodes_per_socket=1, cores_per_node=10,
        numbering=Numbering.ROUND_ROBIN, round_robin_order=(0, 2, 1, 3),
        distances=DistanceSpec(remote=21),
        memory=MemorySpec(128 * GIB),
    )


# DGX H100: GPU buses from public `nvidia-smi` dumps. Each GPU shares a PCIe switch with one
# ConnectX-7 (the NIC takes the bus below the GPU), so the host bridge sits four buses below.
_DGX_GPU_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)
# The driver numbers /dev/nvidiaN in probe order, which need not match NVML's index.
_DGX_MINORS = (2, 3, 0, 1, 6, 7, 4, 5)


def _dgx_h100() -> MachineSpec:
    switches = tuple(
        PcieSwitchSpec(0 if i < 4 else 1, gpus=(GpuSpec(nvswitch_links=18, minor=_DGX_MINORS[i]),),
                       nics=(NicSpec(NicKind.INFINIBAND, _CONNECTX7),), host_bus=bus - 4)
        for i, bus in enumerate(_DGX_GPU_BUSES))
    return MachineSpec(
        name="dgx-h100", sockets=2, nodes_per_socket=1, cores_per_node=56,
        distances=DistanceSpec(remote=21),
        memory=MemorySpec(1008 * GIB, hugepages={1048576: 128}),
        switches=switches,
        nvswitches=tuple(NvSwitchSpec(node, host_bus=bus)
                         for node, bus in ((0, 0x08), (0, 0x0A), (1, 0xA4), (1, 0xA6))),
    )


def _pcie_4gpu() -> MachineSpec:
    def pair(minors: tuple[int, int]) -> tuple[GpuSpec, ...]:
        return tuple(GpuSpec("NVIDIA L40S", 0x26B9, minor=m) for m in minors)

    return MachineSpec(
        name="pcie-4gpu", sockets=2, nodes_per_socket=1, cores_per_node=16,
        distances=DistanceSpec(remote=21),
        memory=MemorySpec(256 * GIB, hugepages={2048: 2048}),
        switches=(PcieSwitchSpec(0, gpus=pair((1, 0))), PcieSwitchSpec(1, gpus=pair((3, 2)))),
        root_port_nics=(RootPortNicSpec(0, NicSpec(NicKind.ETHERNET, _CONNECTX6_DX, "ens1f0")),
                        RootPortNicSpec(1, NicSpec(NicKind.ETHERNET, _CONNECTX6_DX, "ens2f0"))),
    )


# GB200 compute tray: two Grace CPUs (72 Arm cores each, no SMT) and four B200 GPUs, two per
# Grace. Each GPU's HBM is a NUMA node of its own, with memory and no CPUs, at distance 80 from
# every other node (as the `nvidiagpunumanodes` hwloc tree shows); the Graces are 40 apart.
# Each GPU shares a PCIe switch with one ConnectX-7, as on the DGX preset.
_GB200_GPU_MEMORY = 186 * GIB
_GB200_GPU_NODES = ((2, 0), (3, 0), (4, 1), (5, 1))  # (GPU memory node, its Grace)


def _gb200() -> MachineSpec:
    switches = tuple(
        PcieSwitchSpec(grace, gpus=(GpuSpec("NVIDIA GB200", 0x2941, nvswitch_links=18,
                                            minor=i),),
                       nics=(NicSpec(NicKind.INFINIBAND, _CONNECTX7),), host_bus=0x10 + 0x10 * i)
        for i, (_, grace) in enumerate(_GB200_GPU_NODES))
    return MachineSpec(
        name="gb200", sockets=2, nodes_per_socket=1, cores_per_node=72, threads_per_core=1,
        distances=DistanceSpec(remote=40),
        memory=MemorySpec(480 * GIB, hugepages={2048: 4096}),
        cpuless_nodes=tuple(CpulessNodeSpec(node, _GB200_GPU_MEMORY, grace, near_distance=80,
                                            far_distance=80)
                            for node, grace in _GB200_GPU_NODES),
        switches=switches,
    )


def _numa64_1024() -> MachineSpec:
    return MachineSpec(
        name="numa64-1024", sockets=8, nodes_per_socket=8, cores_per_node=8, cores_per_l3=8,
        distances=DistanceSpec(sibling=12, remote=32),
        memory=MemorySpec(32 * GIB),
    )


PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    Preset("intel-2s-ht", "2-socket Intel, 2×24 cores HT, a node per socket, 10/21, a NIC with 4 VFs",
           _intel_2s_ht()),
    Preset("intel-2s-snc2", "2-socket Xeon Gold 6248 in SNC2: 4 nodes × 10 cores HT, interleaved, "
                            "10/11/21", _intel_2s_snc2()),
    Preset("amd-epyc-2s-nps4", "2-socket EPYC NPS4: 8 nodes × 16 cores SMT2, L3 per 8 cores, 10/12/32, "
                               "8 A100 PCIe", _amd_epyc_2s_nps4()),
    Preset("intel-4s", "4-socket Xeon E7, 4×10 cores HT, round-robin numbering (node0 0,4,8,…), 10/21",
           _intel_4s()),
    Preset("dgx-h100", "DGX-H100-like: 2×56 cores HT, 8 H100 on 4 NVSwitches, 8 ConnectX-7 beside the GPUs",
           _dgx_h100()),
    Preset("pcie-4gpu", "2-socket, 2×16 cores HT, 4 L40S in pairs behind 2 PCIe switches, 2 NICs",
           _pcie_4gpu()),
    Preset("gb200", "GB200-like: 2 Grace × 72 cores, 4 GPUs, their memory on 4 CPU-less nodes, "
                    "4 ConnectX-7", _gb200()),
    Preset("numa64-1024", "64 NUMA nodes, 1024 CPUs: 8 sockets × 8 nodes × 8 cores × 2 threads, 10/12/32",
           _numa64_1024()),
)})


@lru_cache(maxsize=None)
def preset_topology(name: str) -> Topology:
    """The Topology of preset ``name``; KeyError names the valid presets."""
    preset = PRESETS.get(name)
    if preset is None:
        raise KeyError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return build_topology(preset.spec)
