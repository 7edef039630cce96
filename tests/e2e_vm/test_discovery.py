"""Discovery on a real multi-NUMA kernel: `nri-numa topology --json` in the numa-vm guest says what
the layout built (nodes, their CPUs, SMT siblings, sockets, distances, memory, huge pages, the
nodes of the PCI devices), and so does hwloc's lstopo in the same guest."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from nri_numa.topology.cpulist import parse_list
from tests.e2e_vm.conftest import Guest
from tests.e2e_vm.layout import Layout
from tests.integration.lstopo_xml import HwlocView, parse

pytestmark = [pytest.mark.vm, pytest.mark.memory_only_node]
MiB = 1 << 20
# Of a node's memory the kernel keeps some for itself (node 0 the most); the guest's own share.
MEMORY_SEEN_LOW, MEMORY_SEEN_HIGH = 0.80, 1.0
PCI_CLASS = {"nic": 0x0200, "nvme": 0x0108}  # class and subclass: Ethernet, NVM Express


@pytest.fixture(scope="module")
def topology(guest: Guest) -> dict:
    return guest.json(["nri-numa", "topology", "--json"])  # type: ignore[return-value]


@pytest.fixture(scope="module")
def hwloc(guest: Guest) -> HwlocView:
    return parse(guest.run(["lstopo-no-graphics", "--of", "xml", "-"]).stdout)


def nodes_seen(topology: dict) -> dict[int, frozenset[int]]:
    return {n["id"]: parse_list(n["cpus"]) for n in topology["numa_nodes"]}


def test_nodes_hold_the_layouts_cpus(topology: dict, vm_layout: Layout) -> None:
    assert nodes_seen(topology) == {n.id: frozenset(n.cpus) for n in vm_layout.nodes}


def test_smt_siblings_and_sockets_are_the_layouts(topology: dict, vm_layout: Layout) -> None:
    cores: dict[tuple[int, int], set[int]] = defaultdict(set)
    sockets = {}
    for cpu in topology["cpus"]:
        cores[(cpu["socket"], cpu["core"])].add(cpu["id"])
        sockets[cpu["id"]] = cpu["socket"]
    expected = {frozenset(group) for n in vm_layout.nodes for group in n.siblings}
    assert {frozenset(c) for c in cores.values()} == expected
    assert sockets == {cpu: n.socket for n in vm_layout.nodes for cpu in n.cpus}


def test_distances_are_the_layouts(topology: dict, vm_layout: Layout) -> None:
    seen = {n["id"]: {int(k): v for k, v in n["distances"].items()} for n in topology["numa_nodes"]}
    assert seen == {a.id: {b.id: vm_layout.distance(a.id, b.id) for b in vm_layout.nodes} for a in vm_layout.nodes}


def test_each_node_has_its_memory_and_huge_pages(topology: dict, vm_layout: Layout) -> None:
    for node in topology["numa_nodes"]:
        wanted = vm_layout.node(node["id"])
        share = node["memory_bytes"] / (wanted.memory_mib * MiB)
        assert MEMORY_SEEN_LOW <= share <= MEMORY_SEEN_HIGH, \
            f"node {node['id']}: {node['memory_bytes']} bytes of {wanted.memory_mib} MiB"
        assert node["hugepages"]["2048"]["total"] == wanted.hugepages_2m, f"node {node['id']}"


def test_pci_devices_are_on_their_nodes(topology: dict, vm_layout: Layout) -> None:
    """Devices behind a node's expander bridge carry its node; those on the root bus none."""
    seen = Counter((d["numa_node"], int(d["class"], 16) >> 8) for d in topology["pci_devices"]
                   if d["numa_node"] is not None and int(d["class"], 16) >> 8 in PCI_CLASS.values())
    assert seen == Counter((d.node, PCI_CLASS[d.kind]) for d in vm_layout.pci)
    on_nodes = {d["address"]: d["numa_node"] for d in topology["pci_devices"]}
    nics = {nic["pci_address"] for nic in topology["nics"]}
    assert sum(1 for address in nics if on_nodes.get(address) is not None) == \
        sum(1 for d in vm_layout.pci if d.kind == "nic")


def test_lstopo_sees_the_same_machine(topology: dict, hwloc: HwlocView, vm_layout: Layout) -> None:
    with_cpus = {node: cpus for node, cpus in nodes_seen(topology).items() if cpus}
    assert {node: cpus for node, cpus in hwloc.nodes.items() if node in with_cpus} == with_cpus
    # A memory-only node has no CPUs of its own; hwloc hangs it, with their CPUs, under the
    # nearest node that has some.
    for node in set(hwloc.nodes) - set(with_cpus):
        nearest = min(with_cpus, key=lambda other: vm_layout.distance(node, other))
        assert hwloc.nodes[node] == with_cpus[nearest], f"memory-only node {node}"
    cores: dict[tuple[int, int], set[int]] = defaultdict(set)
    for cpu in topology["cpus"]:
        cores[(cpu["socket"], cpu["core"])].add(cpu["id"])
    assert sorted(map(sorted, hwloc.cores)) == sorted(map(sorted, cores.values()))
    assert hwloc.distances == {n["id"]: {int(k): v for k, v in n["distances"].items()}
                               for n in topology["numa_nodes"]}
    assert hwloc.memory == {n["id"]: n["memory_bytes"] for n in topology["numa_nodes"] if n["memory_bytes"]}
    node_cpus = nodes_seen(topology)
    for device in topology["pci_devices"]:
        if device["numa_node"] is not None and device["address"] in hwloc.pci:
            assert hwloc.pci[device["address"]].parent_cpus == node_cpus[device["numa_node"]], device["address"]
