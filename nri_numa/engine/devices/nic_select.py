"""Which NICs to give a container: the ones nearest, over PCIe, to the GPUs it got.

A NIC's distance to a GPU is their PCIe level (``parts.pcie_level``): the same PCIe switch first
(``single``, then ``multiple`` for a deeper tree under one root port), then the same host bridge,
then the same NUMA node, then anything (across sockets, or locality unknown). A NIC's tier is its
distance to the nearest of the container's GPUs; NICs are taken by tier, and within a tier the
GPUs are served in turn, a NIC at a time (a GPU whose nearest NICs have been taken least goes
first), so two GPUs on two switches get one NIC each rather than both NICs of one switch.
Remaining ties go to the lowest id. Without GPUs every NIC is in one tier and the order is by id.

A NIC id may be a PCI address (an SR-IOV VF or a PF, as the SR-IOV device plugin names them), a
netdev name or an RDMA device name (``mlx5_0``); an id the topology does not know sorts after the
known ones. Work is O(size x NICs x GPUs): trivial at the 32 NICs and 16 GPUs of a large node.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from nri_numa.engine.devices import Chooser, device_id_key
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import PCIE_LEVELS, Gpu, PciDevice, pcie_level

UNKNOWN_TIER = len(PCIE_LEVELS)  # after every PCIe level


@dataclass(frozen=True, slots=True)
class _Candidate:
    id: str
    tier: int
    nearest: frozenset[int]  # positions of the GPUs at that tier


def nic_chooser(topology: Topology, near_gpus: Collection[str] = ()) -> Chooser:
    """A chooser that prefers NICs near ``near_gpus`` (GPU PCI addresses or UUIDs)."""
    gpus = [_gpu_pci(topology, g) for g in near_gpus]
    anchors = [p for p in gpus if p is not None]

    def choose(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        devices = {i: nic_pci(topology, i) for i in {*available, *must_include}}
        return select_nics(devices, anchors, size, must_include)

    return choose


def select_nics(nics: dict[str, PciDevice | None], near: Sequence[PciDevice], size: int,
                must_include: Sequence[str] = ()) -> list[str]:
    """``size`` NIC ids (must-include ones first) from ``nics`` (id → its PCI function)."""
    if size < len(set(must_include)):
        raise ValueError(f"{len(set(must_include))} NICs must be included but only {size} "
                         "were asked for")
    missing = sorted(set(must_include) - set(nics), key=device_id_key)
    if missing:
        raise ValueError(f"must-include NICs {missing} are not among the available NICs")
    candidates = {i: _candidate(i, pci, near) for i, pci in nics.items()}
    load = [0] * len(near)  # NICs taken so far per GPU, among those nearest to it
    chosen: list[str] = []

    def take(candidate: _Candidate) -> None:
        chosen.append(candidate.id)
        for g in candidate.nearest:
            load[g] += 1

    for i in dict.fromkeys(must_include):
        take(candidates.pop(i))
    while len(chosen) < size and candidates:
        best = min(candidates.values(), key=lambda c: (
            c.tier, min((load[g] for g in c.nearest), default=0), device_id_key(c.id)))
        take(candidates.pop(best.id))
    return chosen


def _candidate(nic_id: str, pci: PciDevice | None, near: Sequence[PciDevice]) -> _Candidate:
    if pci is None:
        return _Candidate(nic_id, UNKNOWN_TIER, frozenset())
    if not near:
        return _Candidate(nic_id, 0, frozenset())
    tiers = [PCIE_LEVELS.index(pcie_level(pci, gpu)) for gpu in near]
    tier = min(tiers)
    return _Candidate(nic_id, tier, frozenset(g for g, t in enumerate(tiers) if t == tier))


def nic_pci(topology: Topology, nic_id: str) -> PciDevice | None:
    """The PCI function behind a NIC id: a PCI address, a netdev or an RDMA device name.

    A VF that the topology lists under its PF but not as a PCI device of its own stands in as
    its PF: same switch, same host bridge, same node.
    """
    pci = topology.pci(nic_id.lower())
    if pci is not None:
        return pci
    for nic in topology.nics:
        if nic.pci_address is None:
            continue
        if nic_id == nic.name or nic_id in nic.rdma or nic_id.lower() in nic.vfs:
            return topology.pci(nic.pci_address)
    return None


def _gpu_pci(topology: Topology, gpu_id: str) -> PciDevice | None:
    """A GPU's PCI function; a GPU the PCI list lacks still has its address and NUMA node."""
    gpu = _find_gpu(topology.gpus, gpu_id)
    address = gpu.pci_address if gpu is not None else gpu_id.lower()
    pci = topology.pci(address)
    if pci is not None or gpu is None:
        return pci
    return PciDevice(address=gpu.pci_address, numa_node=gpu.numa_node, class_code=0x030200,
                     vendor=0x10DE, device=0)


def _find_gpu(gpus: Sequence[Gpu], gpu_id: str) -> Gpu | None:
    for gpu in gpus:
        if gpu_id in (gpu.uuid, gpu.pci_address) or gpu_id.lower() == gpu.pci_address:
            return gpu
    return None
