"""Synthetic machines written as sysfs trees, read back by discover() and by hwloc's lstopo.

The round trip is the contract: ``discover(write_tree(t)) == t`` with no warnings, for every
preset, for an awkward hand-made machine, and for every real machine in hwloc's dumps (captured by
discover first). lstopo is the independent oracle: it must see the same machine in the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.integration.lstopo_xml import run_lstopo_on_tree
from tests.tmpfs import fast_tmp

from nri_numa.topology import Topology, discover
from nri_numa.topology.parts import Nic, NumaNode, PciDevice
from nri_numa.topology.synthetic import (
    FAKE_NVML_FILE,
    PRESETS,
    CpulessNodeSpec,
    DistanceSpec,
    GpuSpec,
    MachineSpec,
    MemorySpec,
    NicSpec,
    NvLinkBridgeSpec,
    PcieSwitchSpec,
    SmtLayout,
    WriteTreeError,
    build_topology,
    preset_topology,
    write_tree,
)
from nri_numa.topology.synthetic.spec import GIB
from nri_numa.topology.synthetic.sysfs_tree import kernel_mask

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"

# Everything awkward at once: sparse node ids, CPU-less and memoryless nodes, offline CPUs
# (cpu0 among them), isolated CPUs, adjacent SMT pairs, SR-IOV, NVLink bridges across sockets.
AWKWARD = MachineSpec(
    name="awkward", sockets=2, nodes_per_socket=2, cores_per_node=4, smt=SmtLayout.ADJACENT,
    node_ids=(0, 2, 33, 34), cores_per_l3=2, distances=DistanceSpec(sibling=12, remote=32),
    memory=MemorySpec(8 * GIB, hugepages={2048: 16}, memoryless_nodes={2}),
    cpuless_nodes=(CpulessNodeSpec(250, 16 * GIB, near_node=0), CpulessNodeSpec(251, 16 * GIB, near_node=33)),
    offline_cpus={0, 5, 30, 31}, isolcpus={2, 3},
    switches=(PcieSwitchSpec(0, gpus=(GpuSpec(minor=1), GpuSpec(minor=0)), nics=(NicSpec(vfs=2),)),
              PcieSwitchSpec(33, gpus=(GpuSpec(),), host_bus=0x80)),
    nvlink_bridges=(NvLinkBridgeSpec(0, 2, 4),),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Iterator[Path]:
    # The 1024-CPU tree is ~45k files: seconds on tmpfs, far longer on a busy disk.
    with fast_tmp(tmp_path_factory.mktemp("synthetic")) as path:
        yield path


@pytest.fixture(scope="module")
def tree_of(scratch) -> Callable[[str], Path]:
    """preset name → its tree, each written once for the module."""
    written: dict[str, Path] = {}

    def tree(name: str) -> Path:
        if name not in written:
            root = scratch / name
            root.mkdir()
            write_tree(preset_topology(name), root)
            written[name] = root
        return written[name]

    return tree


def assert_same(found: Topology, expected: Topology) -> None:
    """Field by field first, so that a failure names the part that differs."""
    for name in ("cpus", "numa_nodes", "isolcpus", "pci_devices", "nics", "gpus"):
        assert getattr(found, name) == getattr(expected, name), name
    assert found.without_warnings() == expected.without_warnings()


# --- round trips through discover -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_reads_back_as_itself(name, tree_of):
    topology = preset_topology(name)
    found = discover(tree_of(name))
    assert found.warnings == ()
    assert_same(found, topology)
    assert Topology.from_json(found.to_json()) == found


def test_an_awkward_machine_reads_back_as_itself(scratch):
    topology = build_topology(AWKWARD)
    root = scratch / "awkward"
    root.mkdir()
    write_tree(topology, root)
    found = discover(root)
    assert found.warnings == ()
    assert_same(found, topology)


def test_a_tree_still_reads_after_it_is_moved(tree_of, scratch):
    moved = scratch / "moved" / "elsewhere"
    shutil.copytree(tree_of("pcie-4gpu"), moved, symlinks=True)
    found = discover(moved)
    assert found.warnings == ()
    assert_same(found, preset_topology("pcie-4gpu"))


@pytest.mark.fixtures
def test_captured_real_machines_become_trees_that_read_back_the_same(hwloc_trees, scratch):
    """Any capture (here: discover on hwloc's dumps of real machines) can be written out.

    The captures carry warnings where the dumps are damaged; what they say is kept, and the
    rewritten tree says the same."""
    for name, root in sorted(hwloc_trees.items()):
        captured = discover(root).without_warnings()
        out = scratch / f"captured-{name}"
        out.mkdir()
        write_tree(captured, out)
        assert_same(discover(out), captured)


# --- the tree itself ------------------------------------------------------------------------------

def test_links_are_relative_and_stay_inside_the_tree(tree_of):
    root = tree_of("dgx-h100").resolve()
    links = 0
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                links += 1
                assert not os.readlink(path).startswith("/"), path
                assert path.resolve().is_relative_to(root), path
    topology = preset_topology("dgx-h100")
    assert links >= len(topology.cpus) + 2 * len(topology.pci_devices)  # node, bus and driver links


def test_distance_columns_follow_online_nodes_in_ascending_order(scratch):
    root = scratch / "distances"
    root.mkdir()
    write_tree(build_topology(AWKWARD), root)
    assert (root / NODE / "online").read_text() == "0,2,33-34,250-251\n"
    assert (root / NODE / "node33/distance").read_text() == "32 32 10 12 120 80\n"
    assert (root / NODE / "has_cpu").read_text() == "0,2,33-34\n"
    assert (root / NODE / "has_memory").read_text() == "0,33-34,250-251\n"


def test_cpu_files_are_those_of_a_real_kernel(scratch):
    root = scratch / "cpus"
    root.mkdir()
    write_tree(build_topology(AWKWARD), root)
    cpu = root / CPU
    assert (cpu / "online").read_text() == "1-4,6-29\n"
    assert (cpu / "offline").read_text() == "0,5,30-31\n"
    assert (cpu / "possible").read_text() == "0-31\n"
    assert (cpu / "isolated").read_text() == "2-3\n"
    # cpu0 cannot be unplugged on x86, so an online cpu0 has no `online`; an offline one must.
    assert (cpu / "cpu0/online").read_text() == "0\n"
    assert not (cpu / "cpu0/topology").exists() and not (cpu / "cpu0/cache").exists()
    assert os.readlink(cpu / "cpu0/node0") == "../../node/node0"
    assert (cpu / "cpu3/topology/core_cpus_list").read_text() == "2-3\n"
    assert (cpu / "cpu3/topology/core_cpus").read_text() == "0000000c\n"
    assert (cpu / "cpu3/cache/index3/shared_cpu_list").read_text() == "1-3\n"
    assert (cpu / "cpu3/cache/index3/level").read_text() == "3\n"
    assert (cpu / "cpu3/cache/index3/type").read_text() == "Unified\n"
    assert (cpu / "cpu16/topology/physical_package_id").read_text() == "1\n"
    assert (cpu / "cpu16/topology/core_id").read_text() == "0\n"  # counted within the package
    assert (root / NODE / "node0/meminfo").read_text().startswith(f"Node 0 MemTotal:       {8 * 1024 * 1024:8d} kB\n")
    assert (root / NODE / "node0/hugepages/hugepages-2048kB/nr_hugepages").read_text() == "16\n"


@pytest.mark.parametrize("ids, width, text", [
    ({0, 1}, 2, "3"),  # what a 2-CPU machine shows
    ({0, 4, 8}, 40, "00,00000111"),
    (set(), 64, "00000000,00000000"),
    ({63}, 64, "80000000,00000000"),
    ({32}, 33, "1,00000000"),
])
def test_masks_are_printed_as_the_kernel_prints_them(ids, width, text):
    assert kernel_mask(ids, width) == text


def test_gpus_come_with_a_fake_nvml_and_driver_proc_files(tree_of):
    root = tree_of("dgx-h100")
    description = json.loads((root / FAKE_NVML_FILE).read_text())
    assert [g["pci_address"] for g in description["gpus"]] == [g.pci_address for g in preset_topology("dgx-h100").gpus]
    info = (root / "proc/driver/nvidia/gpus/0000:52:00.0/information").read_text()
    assert "Device Minor: \t 0\n" in info and "Bus Location: \t 0000:52:00.0" in info
    assert not (tree_of("intel-4s") / FAKE_NVML_FILE).exists()


def test_nics_have_class_net_links_and_rdma_devices(tree_of):
    root = tree_of("intel-2s-ht")
    net = root / "sys/class/net/ens1f0v2"
    assert net.resolve().parent.parent.name == "0000:11:00.3"
    assert (net / "device").resolve().name == "0000:11:00.3"
    pf = root / "sys/bus/pci/devices/0000:11:00.0"
    assert (pf / "virtfn2").resolve().name == "0000:11:00.3"
    assert (pf / "sriov_numvfs").read_text() == "4\n"
    assert (root / "sys/bus/pci/devices/0000:11:00.3/physfn").resolve() == pf.resolve()
    assert (pf / "infiniband/mlx5_0").is_dir()
    assert (pf / "driver").resolve().name == "mlx5_core"


# --- bad input ------------------------------------------------------------------------------------

def _with(topology: Topology, **changes) -> Topology:
    fields = {name: getattr(topology, name) for name in ("cpus", "numa_nodes", "isolcpus", "pci_devices", "nics", "gpus")}
    fields.update(changes)
    return Topology(**fields)


@pytest.mark.parametrize("change, message", [
    (lambda t: {"nics": (Nic("eth9", "0000:ee:00.0"),)}, "eth9 sits on PCI device 0000:ee:00.0"),
    (lambda t: {"nics": (Nic("../x", None),)}, "name '../x' is not usable"),
    (lambda t: {"numa_nodes": (NumaNode(0, t.node(0).cpus, GIB, {}, {0: 10}), t.node(1))},
     "node 0 has no distance to node"),
    (lambda t: {"numa_nodes": (NumaNode(0, t.node(0).cpus, GIB + 1, {}, {0: 10, 1: 21}), t.node(1))},
     "not a whole number of KiB"),
])
def test_topologies_that_cannot_be_laid_out_are_refused_by_name(change, message, tmp_path):
    topology = preset_topology("pcie-4gpu")
    with pytest.raises(WriteTreeError, match=message):
        write_tree(_with(topology, **change(topology)), tmp_path)


def test_bad_pci_addresses_are_refused(tmp_path):
    topology = preset_topology("intel-4s")
    bad = PciDevice("0000:1b:00.0", 0, 0x030200, 0x10DE, 0x2330, bridges=("../../etc",), host_bridge="pci0000:00")
    with pytest.raises(WriteTreeError, match="'../../etc' is not a PCI address"):
        write_tree(_with(topology, pci_devices=(bad,)), tmp_path)


# --- lstopo as the oracle -------------------------------------------------------------------------

@pytest.mark.lstopo
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_lstopo_sees_the_machine_we_meant(name, tree_of, lstopo):
    topology = preset_topology(name)
    seen = run_lstopo_on_tree(lstopo, tree_of(name), {})
    assert seen.online == topology.online_cpus
    assert seen.nodes == {n.id: n.cpus for n in topology.numa_nodes}
    assert seen.distances == {n.id: dict(n.distances) for n in topology.numa_nodes}
    assert sorted(map(sorted, seen.packages)) == sorted(map(sorted, _groups(topology, "socket")))
    assert sorted(map(sorted, seen.cores)) == sorted(map(sorted, _groups(topology, "core")))
    assert sorted(map(sorted, seen.l3)) == sorted(map(sorted, _groups(topology, "l3")))
    endpoints = [d for d in topology.pci_devices if d.class_code >> 8 != 0x0604]
    for d in endpoints:
        pci = seen.pci[d.address]
        assert (pci.class_id, pci.vendor, pci.device) == (d.class_code >> 8, d.vendor, d.device)
        assert pci.parent_cpus == topology.node(d.numa_node).cpus, d.address
    assert seen.netdevs == {n.name: n.pci_address for n in topology.nics}
    assert seen.rdma == {r: n.pci_address for n in topology.nics for r in n.rdma}


@pytest.mark.lstopo
def test_lstopo_sees_gpus_and_nics_behind_their_switch(tree_of, lstopo):
    """hwloc builds the PCI tree from bridge bus numbers in config space, so this checks those."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")} | {"HWLOC_COMPONENTS": "-x86"}
    text = subprocess.run([lstopo, "--input", str(tree_of("dgx-h100")), "--of", "console", "--no-caches"],
                          env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = text.splitlines()
    nic = next(i for i, line in enumerate(lines) if "PCI 1a:00.0" in line)
    gpu = next(i for i, line in enumerate(lines) if "PCI 1b:00.0" in line)
    depth = lambda i: (len(lines[i]) - len(lines[i].lstrip())) // 2  # noqa: E731
    # host bridge > root port > switch upstream > a downstream port each > NIC, GPU
    assert [lines[nic - k].strip() for k in (4, 3, 2, 1)] == ["HostBridge"] + ["PCIBridge"] * 3
    assert depth(nic) == depth(gpu) == depth(nic - 4) + 4
    assert lines[gpu - 1].strip() == "PCIBridge" and depth(gpu - 1) == depth(gpu) - 1
    # Nothing between them climbs above the downstream ports: one switch holds both.
    assert min(depth(i) for i in range(nic, gpu)) == depth(gpu) - 1


def _groups(topology: Topology, key: str) -> list[frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for c in topology.cpus:
        if c.online and getattr(c, key) is not None:
            groups.setdefault(getattr(c, key), set()).add(c.id)
    return [frozenset(g) for g in groups.values()]
