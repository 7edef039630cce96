"""The sysfs readers against hwloc's lstopo on hwloc's own sysfs dumps.

lstopo runs here, in the test, on the same unpacked tree (``--input DIR``) with the x86 CPUID
backend switched off, so both sides read nothing but the tree. Where the two disagree because hwloc
chose to (hide GPU memory nodes, drop conflicting objects, place whole PCI trees by one locality)
the test says so explicitly below; everything else must match exactly.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_numa.topology import netdev, pci, sysfs
from nri_numa.topology.parts import Cpu, Nic, NumaNode, PciDevice
from tests.integration.lstopo_xml import HwlocView, run_lstopo_on_tree

pytestmark = [pytest.mark.fixtures, pytest.mark.lstopo]

# hwloc hides NUMA nodes made of NVIDIA GPU memory (POWER9 + V100) unless told to keep them; the
# kernel shows them as ordinary CPU-less nodes, so we keep them and ask hwloc to keep them too.
_LSTOPO_ENV = {"nvidiagpunumanodes": {"HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES": "1"}}

# Objects that hwloc refuses to insert because their CPU sets conflict with others (it says so
# on stderr, hidden by HWLOC_SHOW_ERRORS in its own test). The tree is hand-edited: the kernel
# files describe these groups, and we report what the kernel files say. Checked by hand:
# 40intel64-4n10c+pci-conflicts.test in hwloc: "4th socket conflicts, ignored", "3rd L3
# conflicts, ignored".
_HWLOC_DROPPED = {
    "40intel64-4n10c+pci-conflicts": {"packages": 1, "l3": 1},
}

# AMD family 21 (Bulldozer, here an Opteron 6276): the kernel lists the two integer cores of a
# compute unit as thread siblings, each with its own core_id. hwloc, seeing the AMD family in
# /proc/cpuinfo, makes each its own Core; we keep the kernel's grouping (core_cpus, else
# thread_siblings), so one of our cores is exactly a pair of hwloc's.
_AMD_COMPUTE_UNITS = {"64amd64-4s2n4ca2co"}

# What the readers warn about on each dump, in order: hand edits and trimmed files.
_KNOWN_FINDINGS = {
    # node 0 was marked offline by hand: node/online is "1", but node1/distance kept both
    # columns ("21 10"), and the even CPUs kept their (now dangling) node0 links while no online
    # node lists them.
    "offline-cpu0-node0": [
        r"node1/distance has 2 entries, but there is one column per online node \(1\)",
        r"online CPUs 4,6,8,10,12,14,16,18,20 are in no online NUMA node's cpulist",
    ],
    # hwloc trimmed these six GPU functions to class and local_cpus.
    "nvidiagpunumanodes": [
        rf"devices/{address}/{name} is missing"
        for address in ("0004:05:00.0", "0004:06:00.0", "0006:00:00.0", "0007:00:00.0",
                        "0035:04:00.0", "0035:05:00.0")
        for name in ("numa_node", "vendor", "device")
    ],
}


@dataclass(frozen=True)
class Ours:
    cpus: tuple[Cpu, ...]
    nodes: tuple[NumaNode, ...]
    pci: tuple[PciDevice, ...]
    nics: tuple[Nic, ...]
    warnings: tuple[str, ...]

    @property
    def online(self) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus if c.online)

    def groups(self, key: str) -> list[frozenset[int]]:
        by_value: dict[int, set[int]] = defaultdict(set)
        for c in self.cpus:
            if c.online and getattr(c, key) is not None:
                by_value[getattr(c, key)].add(c.id)
        return sorted((frozenset(s) for s in by_value.values()), key=min)


@pytest.fixture(scope="module")
def views() -> dict[str, tuple[Ours, HwlocView]]:
    """Both readings of each tree, made once for all the tests of this module."""
    return {}


@pytest.fixture
def both(request, views, hwloc_trees, lstopo) -> tuple[str, Ours, HwlocView]:
    name = request.param
    if name not in views:
        tree = hwloc_trees[name]
        warnings: list[str] = []
        cpus, nodes, _ = sysfs.read_cpus_and_nodes(tree, warnings)
        devices = pci.read_pci_devices(tree, warnings)
        nics = netdev.read_nics(tree, devices, warnings, netlink=False)
        ours = Ours(cpus, nodes, devices, nics, tuple(warnings))
        views[name] = (ours, run_lstopo_on_tree(lstopo, tree, _LSTOPO_ENV.get(name, {})))
    return (name, *views[name])


# The same list tests/conftest.py unpacks; needed here at collection time to name each test.
_FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "hwloc-sysfs"
NAMES = sorted(p.name.removesuffix(".tar.bz2") for p in _FIXTURES.glob("*.tar.bz2"))
by_tree = pytest.mark.parametrize("both", NAMES, indirect=True)


@by_tree
def test_online_cpus(both):
    name, ours, hw = both
    assert ours.online == hw.online


@by_tree
def test_numa_node_ids(both):
    name, ours, hw = both
    # hwloc 2.9 shows memory-less and CPU-less nodes too (fakememinitiators: nodes 0-4 have no
    # memory, node 4 not even CPUs); the GPU memory nodes it would hide are kept by _LSTOPO_ENV.
    assert {n.id for n in ours.nodes} == set(hw.nodes)


@by_tree
def test_numa_node_memory(both):
    name, ours, hw = both
    # hwloc prints local_memory only for nodes that have some; ours says 0 for the others.
    ours_memory = {n.id: n.memory_bytes for n in ours.nodes}
    assert hw.memory == {i: m for i, m in ours_memory.items() if m or i in hw.memory}


@by_tree
def test_numa_distances(both):
    name, ours, hw = both
    distances = {n.id: dict(n.distances) for n in ours.nodes}
    if hw.distances:
        assert distances == hw.distances
    else:
        # hwloc keeps no matrix for one node, nor when a row does not fit the online nodes
        # (offline-cpu0-node0, where we warn and drop that row too).
        assert all(d.keys() <= {i} for i, d in distances.items())


@by_tree
def test_cpus_per_node(both):
    name, ours, hw = both
    # A CPU-less node has no CPUs of its own; hwloc gives it the CPU set of the object it hangs
    # it under (its initiators' package or group, or the machine), which is a placement choice.
    with_cpus = {n.id: n.cpus for n in ours.nodes if n.cpus}
    assert with_cpus == {i: hw.nodes[i] for i in with_cpus}


@by_tree
def test_cpu_numa_matches_node_cpus(both):
    name, ours, hw = both
    for cpu in ours.cpus:
        if cpu.online and cpu.numa is not None:
            assert cpu.id in hw.nodes[cpu.numa], cpu


@by_tree
def test_packages(both):
    name, ours, hw = both
    _assert_same_groups(name, "packages", ours.groups("socket"), hw.packages)


@by_tree
def test_cores(both, hwloc_trees):
    name, ours, hw = both
    if name in _AMD_COMPUTE_UNITS:
        _assert_compute_units_split(hwloc_trees[name], ours.groups("core"), hw.cores)
        return
    _assert_same_groups(name, "cores", ours.groups("core"), hw.cores)


@by_tree
def test_l3_groups(both):
    name, ours, hw = both
    _assert_same_groups(name, "l3", ours.groups("l3"), hw.l3)


@by_tree
def test_pci_devices_present(both, hwloc_trees):
    name, ours, hw = both
    assert set(hw.pci) <= {d.address for d in ours.pci}
    # hwloc drops a PCI bridge whose config space gives no valid secondary/subordinate bus
    # (an unconfigured bridge: 00/00); the kernel still lists the function, and so do we.
    for d in ours.pci:
        if d.address not in hw.pci:
            assert d.class_code >> 8 == 0x0604, d
            assert not _valid_bridge_buses(hwloc_trees[name], d.address), d


@by_tree
def test_pci_ids(both):
    name, ours, hw = both
    for d in ours.pci:
        if d.address in hw.pci:
            seen = hw.pci[d.address]
            assert (d.class_code >> 8, d.vendor, d.device) == \
                (seen.class_id, seen.vendor, seen.device), d.address


@by_tree
def test_pci_numa_locality(both):
    """The NUMA nodes near each PCI device, as hwloc places it and as our model says.

    hwloc's XML gives a PCI device no CPU set of its own, only a place in the tree: it hangs
    the device under the smallest object whose CPUs cover the locality (``local_cpus``) of the
    *first function of its host bridge's tree*, and under the machine when that locality is
    empty or fits no object. So the sound comparison is by node: the CPU-bearing nodes that meet
    the CPUs of hwloc's parent object, against the nodes that meet our ``local_cpus`` of that
    same first function. ``numa_node`` cannot be compared to the XML directly: it is -1 (None
    here) on most of these dumps while ``local_cpus`` still places the device.
    """
    name, ours, hw = both
    by_address = {d.address: d for d in ours.pci}
    nodes_with_cpus = {n.id: n.cpus for n in ours.nodes if n.cpus}
    for address, seen in sorted(hw.pci.items()):
        first = by_address[seen.first_in_tree]
        expected = {i for i, c in nodes_with_cpus.items() if c & first.local_cpus}
        if not expected:
            expected = set(nodes_with_cpus)  # hwloc's fallback: attach at the machine
        got = {i for i, c in nodes_with_cpus.items() if c & seen.parent_cpus}
        assert got == expected, f"{address} (tree of {first.address})"


@by_tree
def test_nics_and_rdma(both):
    name, ours, hw = both
    assert {n.name: n.pci_address for n in ours.nics} == hw.netdevs
    rdma = {r: n.pci_address for n in ours.nics for r in n.rdma}
    # hwloc also lists RDMA devices on functions that have no netdev; a Nic carries only those
    # on its own function.
    assert rdma == {r: a for r, a in hw.rdma.items() if a in hw.netdevs.values()}


@by_tree
def test_warnings_are_the_known_findings(both):
    """Every warning on these dumps is a known oddity of the dump; anything else is a bug."""
    name, ours, hw = both
    expected = _KNOWN_FINDINGS.get(name, [])
    assert len(ours.warnings) == len(expected), ours.warnings
    for warning, pattern in zip(ours.warnings, expected):
        assert re.search(pattern, warning), (warning, pattern)


@by_tree
def test_pci_numa_node_is_local(both):
    """A device that knows its node (numa_node, or a bridge's) has that node's CPUs nearby."""
    name, ours, hw = both
    nodes = {n.id: n.cpus for n in ours.nodes}
    for d in ours.pci:
        if d.numa_node is not None and nodes.get(d.numa_node) and d.local_cpus:
            assert nodes[d.numa_node] & d.local_cpus, d


def test_offline_cpus_keep_their_node(hwloc_trees):
    """offline-cpu0-node0: offline CPUs have only cpuN/online and a nodeM link (some dangling)."""
    warnings: list[str] = []
    cpus, nodes, _ = sysfs.read_cpus_and_nodes(hwloc_trees["offline-cpu0-node0"], warnings)
    offline = {c.id: c for c in cpus if not c.online}
    assert sorted(offline) == [0, 1, 2, 3, 21, 22, 23]  # present 0-23, online 4-20
    assert {i: c.numa for i, c in offline.items()} == \
        {0: 0, 1: 1, 2: 0, 3: 1, 21: 1, 22: 0, 23: 1}
    assert all(c.core is c.socket is c.die is c.l3 is None for c in offline.values())
    assert [n.id for n in nodes] == [1]


def _assert_same_groups(name: str, kind: str, ours: list[frozenset[int]],
                        hwloc: list[frozenset[int]]) -> None:
    dropped = _HWLOC_DROPPED.get(name, {}).get(kind, 0)
    missing_in_hwloc = set(ours) - set(hwloc)
    assert set(hwloc) <= set(ours), f"hwloc has {kind} we lack: {set(hwloc) - set(ours)}"
    assert len(missing_in_hwloc) == dropped, \
        f"{kind} hwloc lacks: {sorted(map(sorted, missing_in_hwloc))}"


def _assert_compute_units_split(tree: Path, ours: list[frozenset[int]],
                                hwloc: list[frozenset[int]]) -> None:
    topology = tree / "sys/devices/system/cpu"
    assert all(len(core) == 1 for core in hwloc)
    assert {cpu for core in hwloc for cpu in core} == {cpu for core in ours for cpu in core}
    for core in ours:
        core_ids = {(topology / f"cpu{cpu}/topology/core_id").read_text().strip() for cpu in core}
        assert len(core_ids) == len(core), f"{sorted(core)} share a core_id: not a compute unit"


def _valid_bridge_buses(tree: Path, address: str) -> bool:
    """hwloc's test: secondary and subordinate bus (config bytes 0x19, 0x1a) above the bridge's."""
    config = (tree / "sys/bus/pci/devices" / address / "config").read_bytes()
    bus = int(address.split(":")[1], 16)
    secondary, subordinate = config[0x19], config[0x1A]
    return bus < secondary <= subordinate
