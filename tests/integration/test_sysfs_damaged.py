"""Damaged trees: every fault gives a warning that names it, and the rest of the model survives.

Each test builds a small regular machine (2 sockets x 4 cores x 2 threads, one node per socket;
CPU c and c+8 are siblings) or copies an hwloc dump, breaks one thing, and checks both the
warning and what was still read correctly.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from nri_numa.topology import netdev, pci, sysfs, sysfs_read
from nri_numa.topology.parts import Cpu, NumaNode, PciDevice
from tests.integration.sysfs_tree import (CPU, NODE, Function, Machine, add_netdev, build_machine,
                                          build_pci, link, write)
from tests.tmpfs import fast_tmp

MACHINE = Machine()
NODE0_CPUS = frozenset({0, 1, 2, 3, 8, 9, 10, 11})
NODE1_CPUS = frozenset({4, 5, 6, 7, 12, 13, 14, 15})


@pytest.fixture
def root(tmp_path) -> Path:
    with fast_tmp(tmp_path) as base:
        build_machine(base, MACHINE)
        yield base


def read(root: Path) -> tuple[dict[int, Cpu], dict[int, NumaNode], list[str]]:
    warnings: list[str] = []
    cpus, nodes, _ = sysfs.read_cpus_and_nodes(root, warnings)
    return {c.id: c for c in cpus}, {n.id: n for n in nodes}, warnings


def only(warnings: list[str]) -> str:
    assert len(warnings) == 1, warnings
    return warnings[0]


def test_the_undamaged_machine(root):
    cpus, nodes, warnings = read(root)
    assert warnings == []
    assert nodes[0].cpus == NODE0_CPUS and nodes[1].cpus == NODE1_CPUS
    assert cpus[9] == Cpu(9, numa=0, core=1, socket=0, die=0, l3=0)
    assert nodes[1].distances == {0: 21, 1: 10}
    assert nodes[0].memory_bytes == MACHINE.memory_kib * 1024
    assert set(nodes[0].hugepages) == {2048, 1048576}


# --- truncated, garbage, NUL ------------------------------------------------------------------

def test_truncated_core_list(root):
    write(root, f"{CPU}/cpu1/topology/core_cpus_list", "")
    cpus, nodes, warnings = read(root)
    assert len(warnings) == 2
    assert warnings[0].startswith(f"{root}/{CPU}/cpu1/topology/core_cpus_list leaves out CPU 1")
    # cpu9's own list still says 1,9: CPU 1 now has a core of its own, so 9 goes alone too.
    assert "lists CPUs 1, which already belong to another core" in warnings[1]
    assert cpus[1].core == 1 and cpus[9].core == 9
    assert cpus[10].core == 2 and cpus[1].socket == 0 and cpus[1].l3 == 0


def test_garbage_node_cpulist_falls_back_to_cpumap(root):
    write(root, f"{NODE}/node0/cpulist", "zero-three\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{NODE}/node0/cpulist: expected a list")
    assert nodes[0].cpus == NODE0_CPUS


def test_unusable_cpulist_and_cpumap_fall_back_to_cpu_links(root):
    write(root, f"{NODE}/node1/cpulist", "??")
    write(root, f"{NODE}/node1/cpumap", "??")
    cpus, nodes, warnings = read(root)
    assert len(warnings) == 3
    assert "node1/cpulist: expected" in warnings[0] and "node1/cpumap: expected" in warnings[1]
    assert warnings[2].startswith("node 1: CPUs taken from the cpuN/node1 links instead")
    assert nodes[1].cpus == NODE1_CPUS and cpus[12].numa == 1


def test_nul_terminated_values_are_read(root):
    write(root, f"{NODE}/node0/cpulist", "0-3,8-11\x00")
    write(root, f"{CPU}/cpu5/topology/physical_package_id", "1\x00\x00")
    write(root, f"{NODE}/node1/distance", "21 10\n\x00")
    cpus, nodes, warnings = read(root)
    assert warnings == []
    assert nodes[0].cpus == NODE0_CPUS and cpus[5].socket == 1 and nodes[1].distances[0] == 21


def test_nul_in_the_middle_is_garbage(root):
    write(root, f"{CPU}/online", "0-\x0015")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{CPU}/online: expected a list")
    # Without cpu/online each CPU's own online file decides (cpu0 has none: cannot unplug).
    assert all(c.online for c in cpus.values())


def test_binary_package_id_falls_back_to_lowest_cpu(root):
    (root / CPU / "cpu4/topology/physical_package_id").write_bytes(b"\xff\xfe")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{CPU}/cpu4/topology/physical_package_id is not text")
    assert {cpus[c].socket for c in NODE1_CPUS} == {4}  # the package's lowest CPU
    assert cpus[0].socket == 0


def test_garbage_meminfo(root):
    write(root, f"{NODE}/node1/meminfo", "Node 1 MemFree: 12 kB\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings) == f"{root}/{NODE}/node1/meminfo has no MemTotal line; memory taken as 0"
    assert nodes[1].memory_bytes == 0 and nodes[1].cpus == NODE1_CPUS


# --- deleted ----------------------------------------------------------------------------------

def test_deleted_meminfo_and_distance(root):
    (root / NODE / "node1/meminfo").unlink()
    (root / NODE / "node0/distance").unlink()
    cpus, nodes, warnings = read(root)
    assert warnings == [f"{root}/{NODE}/node0/distance is missing",
                        f"{root}/{NODE}/node1/meminfo is missing"]
    assert nodes[0].distances == {} and nodes[1].distances == {0: 21, 1: 10}
    assert nodes[1].memory_bytes == 0 and nodes[0].memory_bytes > 0


def test_deleted_topology_of_an_online_cpu(root):
    shutil.rmtree(root / CPU / "cpu5/topology")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith("online CPUs 5 have no topology/ directory")
    # cpu13's core list and cpu4's package and die lists still name CPU 5.
    assert cpus[5] == Cpu(5, numa=1, core=5, socket=1, die=4, l3=4)
    assert cpus[13].core == 5


def test_deleted_cpu_online_uses_per_cpu_files(root):
    (root / CPU / "online").unlink()
    write(root, f"{CPU}/cpu6/online", "0\n")
    cpus, nodes, warnings = read(root)
    assert warnings == []
    assert not cpus[6].online and cpus[6].numa == 1 and cpus[6].core is None
    assert cpus[0].online  # no online file: cannot be unplugged
    assert nodes[1].cpus == NODE1_CPUS - {6}


def test_deleted_node_directory_tree(root):
    shutil.rmtree(root / NODE)
    write(root, "proc/meminfo", "MemTotal:       16384256 kB\nMemFree:  1 kB\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{NODE} has no nodeN directories")
    assert list(nodes) == [0]
    assert nodes[0].cpus == NODE0_CPUS | NODE1_CPUS
    assert nodes[0].memory_bytes == 16384256 * 1024 and nodes[0].distances == {0: 10}
    assert {c.numa for c in cpus.values()} == {0}


def test_deleted_cpu_directory_tree(root):
    shutil.rmtree(root / CPU)
    cpus, nodes, warnings = read(root)
    assert cpus == {}
    assert warnings[0] == f"{root}/{CPU} is missing or not a directory"
    assert nodes[0].cpus == frozenset() and nodes[0].memory_bytes > 0


def test_deleted_hugepage_counter(root):
    (root / NODE / "node0/hugepages/hugepages-2048kB/free_hugepages").unlink()
    cpus, nodes, warnings = read(root)
    assert only(warnings).endswith("hugepages-2048kB/free_hugepages is missing")
    assert set(nodes[0].hugepages) == {1048576} and set(nodes[1].hugepages) == {2048, 1048576}


# --- unreadable ---------------------------------------------------------------------------------

def test_file_replaced_by_a_directory(root):
    (root / NODE / "node0/meminfo").unlink()
    (root / NODE / "node0/meminfo").mkdir()
    cpus, nodes, warnings = read(root)
    assert only(warnings) == f"{root}/{NODE}/node0/meminfo is a directory, not a file"
    assert nodes[0].memory_bytes == 0 and nodes[0].cpus == NODE0_CPUS


def test_permission_denied(root, monkeypatch):
    # As root, chmod 000 stops nothing; make the reader meet EACCES as an unprivileged agent would.
    refused = {str(root / CPU / "online"), str(root / NODE / "node1/distance")}
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if os.fspath(path) in refused:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sysfs_read.os, "open", refusing_open)
    cpus, nodes, warnings = read(root)
    assert sorted(warnings) == sorted(f"cannot read {p}: Permission denied" for p in refused)
    assert all(c.online for c in cpus.values())  # from the per-CPU online files
    assert nodes[1].distances == {} and nodes[0].distances == {0: 10, 1: 21}


# --- inconsistent -------------------------------------------------------------------------------

def test_distance_row_of_the_wrong_length(root):
    write(root, f"{NODE}/node0/distance", "10 21 31\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{NODE}/node0/distance has 3 entries, but there "
                                     f"is one column per online node (0-1)")
    assert nodes[0].distances == {} and nodes[1].distances == {0: 21, 1: 10}


def test_distance_row_with_words(root):
    write(root, f"{NODE}/node1/distance", "21 ten\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{NODE}/node1/distance: expected distances")
    assert nodes[1].distances == {}


def test_sparse_online_nodes_set_the_columns(root):
    # Rename node1 to node3: columns now follow online nodes 0,3, not indexes 0..1.
    os.rename(root / NODE / "node1", root / NODE / "node3")
    write(root, f"{NODE}/online", "0,3\n")
    cpus, nodes, warnings = read(root)
    assert nodes[3].distances == {0: 21, 3: 10} and nodes[0].distances == {0: 10, 3: 21}
    assert nodes[3].cpus == NODE1_CPUS
    assert warnings == []


def test_offline_node_directory_is_skipped(root):
    write(root, f"{NODE}/online", "0\n")
    write(root, f"{NODE}/node0/distance", "10\n")
    cpus, nodes, warnings = read(root)
    assert list(nodes) == [0] and nodes[0].distances == {0: 10}
    assert only(warnings).startswith(f"online CPUs {'4-7,12-15'} are in no online NUMA node")
    assert cpus[4].numa is None and cpus[4].socket == 1


def test_cpu_listed_by_two_nodes(root):
    write(root, f"{NODE}/node1/cpulist", "3-7,12-15\n")
    cpus, nodes, warnings = read(root)
    assert only(warnings) == ("node 1 lists CPUs 3, which a lower node also lists; "
                              "they stay with the lower node")
    assert nodes[1].cpus == NODE1_CPUS and cpus[3].numa == 0


def test_cpu_directory_outside_possible(root):
    (root / CPU / "cpu99").mkdir()
    cpus, nodes, warnings = read(root)
    assert only(warnings).startswith(f"{root}/{CPU} has directories for CPUs 99, which are not "
                                     f"in possible (0-15)")
    assert 99 not in cpus and len(cpus) == 16


def test_group_list_that_leaves_out_its_own_cpu(root):
    write(root, f"{CPU}/cpu0/cache/index3/shared_cpu_list", "4-7")
    cpus, nodes, warnings = read(root)
    assert warnings[0].startswith(
        f"{root}/{CPU}/cpu0/cache/index3/shared_cpu_list leaves out CPU 0")
    assert cpus[0].l3 == 0 and cpus[1].l3 == 1  # cpu1's own list (0-3,8-11) minus the taken 0


# --- PCI and netdevs ----------------------------------------------------------------------------

ROOT_PORT = Function("pci0000:00/0000:00:01.0", class_code=0x060400, numa_node=1,
                     local_cpus="4-7,12-15", driver="pcieport")
NIC = Function("pci0000:00/0000:00:01.0/0000:01:00.0", numa_node=-1, local_cpus="4-7,12-15")
GPU = Function("pci0000:00/0000:00:02.0", class_code=0x030200, vendor=0x10DE, device=0x2330,
               numa_node=-1, local_cpus="0-15", driver="nvidia")


def read_pci(root: Path) -> tuple[dict[str, PciDevice], list[str]]:
    warnings: list[str] = []
    return {d.address: d for d in pci.read_pci_devices(root, warnings)}, warnings


@pytest.fixture
def pci_root(tmp_path) -> Path:
    with fast_tmp(tmp_path) as base:
        build_pci(base, [ROOT_PORT, NIC, GPU])
        yield base


def test_numa_node_minus_one_takes_the_bridge_s(pci_root):
    devices, warnings = read_pci(pci_root)
    assert warnings == []
    assert devices[NIC.address].numa_node == 1  # -1, behind a root port on node 1
    assert devices[GPU.address].numa_node is None  # -1 on the host bridge: unknown, never 0
    assert devices[NIC.address].bridges == ("0000:00:01.0",)


def test_numa_node_garbage(pci_root):
    write(pci_root, f"sys/devices/{ROOT_PORT.path}/numa_node", "one")
    devices, warnings = read_pci(pci_root)
    assert only(warnings).startswith(f"{pci_root}/sys/devices/{ROOT_PORT.path}/numa_node: expected")
    assert devices[ROOT_PORT.address].numa_node is None
    assert devices[NIC.address].numa_node is None  # the bridge no longer knows either


def test_dangling_and_looping_device_links(pci_root):
    link(pci_root, "sys/bus/pci/devices/0000:05:00.0", "../../../devices/pci0000:00/0000:05:00.0")
    link(pci_root, "sys/bus/pci/devices/0000:06:00.0", "0000:06:00.0")
    devices, warnings = read_pci(pci_root)
    assert set(devices) == {ROOT_PORT.address, NIC.address, GPU.address}
    assert len(warnings) == 2
    assert warnings[0].startswith(f"{pci_root}/sys/bus/pci/devices/0000:05:00.0 leads to")
    assert warnings[1] == (f"{pci_root}/sys/bus/pci/devices/0000:06:00.0: "
                           f"too many levels of symbolic links")


def test_missing_ids_are_recorded_as_zero(pci_root):
    (pci_root / "sys/devices" / GPU.path / "vendor").unlink()
    write(pci_root, f"sys/devices/{GPU.path}/class", "display")
    devices, warnings = read_pci(pci_root)
    gpu = devices[GPU.address]
    assert (gpu.class_code, gpu.vendor, gpu.device) == (0, 0, 0x2330)
    assert warnings == [
        f"{pci_root}/sys/devices/{GPU.path}/class: expected a hex integer, found 'display'; "
        f"recorded as 0",
        f"{pci_root}/sys/devices/{GPU.path}/vendor is missing; recorded as 0",
    ]


def test_local_cpus_fall_back_to_the_mask(pci_root):
    (pci_root / "sys/devices" / GPU.path / "local_cpulist").unlink()
    write(pci_root, f"sys/devices/{GPU.path}/local_cpus", "0000ff00")
    devices, warnings = read_pci(pci_root)
    assert warnings == [] and devices[GPU.address].local_cpus == frozenset(range(8, 16))


def test_entry_not_named_like_an_address(pci_root):
    (pci_root / "sys/bus/pci/devices/stray").mkdir()
    devices, warnings = read_pci(pci_root)
    assert only(warnings) == (f"{pci_root}/sys/bus/pci/devices/stray is not named like a PCI "
                              f"address; ignored")
    assert len(devices) == 3


def test_dangling_netdev_link(pci_root):
    add_netdev(pci_root, "ens1", NIC.path)
    link(pci_root, "sys/class/net/ens9", "../../devices/pci0000:00/0000:00:09.0/net/ens9")
    add_netdev(pci_root, "lo", "virtual/net")
    warnings: list[str] = []
    devices = pci.read_pci_devices(pci_root, warnings)
    nics = netdev.read_nics(pci_root, devices, warnings, netlink=False)
    assert [(n.name, n.pci_address) for n in nics] == [("ens1", NIC.address)]
    assert only(warnings).startswith(f"{pci_root}/sys/class/net/ens9 leads to")


# --- a real dump, damaged -------------------------------------------------------------------------

@pytest.fixture
def old_kernel(hwloc_trees, tmp_path) -> Path:
    """16em64t-4s2c2t-offlines: a 2.6-era kernel, masks only, no cpu/online, 4 CPUs offline."""
    with fast_tmp(tmp_path) as base:
        copy = base / "tree"
        shutil.copytree(hwloc_trees["16em64t-4s2c2t-offlines"] / "sys", copy / "sys",
                        symlinks=True)
        yield copy


def test_old_kernel_masks_damaged(old_kernel):
    write(old_kernel, f"{CPU}/cpu0/topology/thread_siblings", "not a mask\n")
    write(old_kernel, f"{NODE}/node0/cpumap", "")
    cpus, nodes, warnings = read(old_kernel)
    assert len(warnings) == 2
    assert warnings[0].startswith(f"{old_kernel}/{CPU}/cpu0/topology/thread_siblings: expected")
    # An empty cpumap is an empty node: the CPUs are then homeless, which is reported, not guessed.
    assert warnings[1].startswith("online CPUs 0-1,3-4,6-12,15 are in no online NUMA node")
    assert nodes[0].cpus == frozenset() and {c.numa for c in cpus.values() if c.online} == {None}
    # cpu0 has no other core file, but cpu8's mask still pairs 0 and 8.
    assert cpus[0].core == cpus[8].core == 0 and cpus[1].core == cpus[9].core == 1
    assert [c.id for c in cpus.values() if not c.online] == [2, 5, 13, 14]
