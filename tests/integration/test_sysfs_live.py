"""The readers on this very machine (root "/") against lstopo reading the same machine.

lstopo runs with ``--whole-io`` (every PCI function, not only the "important" ones) and
``--disallowed`` (the whole machine, not only the CPUs this process's cgroup may use), which is
what discovery describes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_numa.topology import netdev, pci, sysfs
from nri_numa.topology.parts import Cpu, Nic, NumaNode, PciDevice
from tests.integration.lstopo_xml import HwlocView, run_lstopo

pytestmark = pytest.mark.lstopo


@dataclass(frozen=True)
class Live:
    cpus: tuple[Cpu, ...]
    nodes: tuple[NumaNode, ...]
    pci: tuple[PciDevice, ...]
    nics: tuple[Nic, ...]
    warnings: list[str]
    hw: HwlocView

    def groups(self, key: str) -> set[frozenset[int]]:
        by_value: dict[int, set[int]] = defaultdict(set)
        for c in self.cpus:
            if c.online and getattr(c, key) is not None:
                by_value[getattr(c, key)].add(c.id)
        return {frozenset(s) for s in by_value.values()}


@pytest.fixture(scope="module")
def live(lstopo) -> Live:
    if not Path("/sys/devices/system/cpu").is_dir():
        pytest.skip("no sysfs mounted at /sys")
    warnings: list[str] = []
    cpus, nodes, _ = sysfs.read_cpus_and_nodes(Path("/"), warnings)
    devices = pci.read_pci_devices(Path("/"), warnings)
    nics = netdev.read_nics(Path("/"), devices, warnings, netlink=True)
    hw = run_lstopo(lstopo, ["--whole-io", "--disallowed"], {})
    return Live(cpus, nodes, devices, nics, warnings, hw)


def test_no_warnings(live):
    assert live.warnings == []


def test_online_cpus(live):
    assert frozenset(c.id for c in live.cpus if c.online) == live.hw.online


def test_nodes_memory_and_cpus(live):
    assert {n.id for n in live.nodes} == set(live.hw.nodes)
    for n in live.nodes:
        if n.cpus:  # a CPU-less node gets the CPU set of wherever hwloc hangs it
            assert n.cpus == live.hw.nodes[n.id], n.id
        if n.id in live.hw.memory:
            assert n.memory_bytes == live.hw.memory[n.id], n.id


def test_distances(live):
    distances = {n.id: dict(n.distances) for n in live.nodes}
    if live.hw.distances:
        assert distances == live.hw.distances
    else:  # hwloc keeps no matrix for a single node
        assert len(distances) == 1 and all(d.keys() <= {i} for i, d in distances.items())


def test_packages_cores_l3(live):
    assert live.groups("socket") == set(live.hw.packages)
    assert live.groups("core") == set(live.hw.cores)
    assert live.groups("l3") == set(live.hw.l3)


def test_pci_devices_and_locality(live):
    """Same functions and ids; NUMA locality compared by node, as for the hwloc dumps."""
    ours = {d.address: d for d in live.pci}
    assert set(live.hw.pci) <= set(ours)
    nodes_with_cpus = {n.id: n.cpus for n in live.nodes if n.cpus}
    for address, seen in live.hw.pci.items():
        d = ours[address]
        assert (d.class_code >> 8, d.vendor, d.device) == (seen.class_id, seen.vendor, seen.device)
        first = ours[seen.first_in_tree]
        expected = {i for i, c in nodes_with_cpus.items() if c & first.local_cpus} \
            or set(nodes_with_cpus)
        assert {i for i, c in nodes_with_cpus.items() if c & seen.parent_cpus} == expected, address
        if d.numa_node is not None:
            assert d.numa_node in expected, address


def test_nics(live):
    ours = {n.name: n.pci_address for n in live.nics}
    assert ours == live.hw.netdevs
