"""MachineSpec checks and build_topology: numbering, groups, distances, memory, devices, presets."""

from collections import Counter

import pytest

from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic import (
    PRESETS,
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
    SmtLayout,
    SpecError,
    build_topology,
    gpu_uuid,
    preset_topology,
)
from nri_numa.topology.synthetic.spec import GIB


def small(**changes) -> MachineSpec:
    fields = dict(name="t", sockets=2, nodes_per_socket=2, cores_per_node=4)
    fields.update(changes)
    return MachineSpec(**fields)


def cpus_of(topology: Topology, node: int) -> str:
    return format_list(topology.node(node).cpus)


# --- bad descriptions -----------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: small(sockets=0), "sockets must be a positive integer"),
    (lambda: small(threads_per_core=True), "threads_per_core must be a positive integer"),
    (lambda: small(cores_per_l3=3), r"cores_per_l3 \(3\) must divide the 8 cores"),
    (lambda: small(cores_per_node=6, cores_per_l3=4), "straddles"),
    (lambda: small(numbering=Numbering.INTERLEAVED, interleave=(2, 0)), "interleave must be positive"),
    (lambda: small(numbering=Numbering.ROUND_ROBIN, round_robin_order=(0, 1, 1, 3)),
     "round_robin_order must list each node position"),
    (lambda: small(round_robin_order=(1, 0, 2, 3)), "round_robin_order is for round-robin numbering"),
    (lambda: small(node_ids=(0, 1)), "node_ids has 2 ids for 4 CPU nodes"),
    (lambda: small(cpuless_nodes=(CpulessNodeSpec(3, GIB, near_node=0),)), r"NUMA node ids repeat"),
    (lambda: small(cpuless_nodes=(CpulessNodeSpec(9, GIB, near_node=7),)), "near_node 7 is not a CPU node"),
    (lambda: small(memory=MemorySpec(GIB + 1)), "whole number of KiB"),
    (lambda: small(memory=MemorySpec(GIB, hugepages={4096: 1})), "hugepage size 4096"),
    (lambda: small(memory=MemorySpec(GIB, hugepages={1048576: 2})), "more than the node's"),
    (lambda: small(memory=MemorySpec(GIB, memoryless_nodes={5})), "not CPU nodes: \\[5\\]"),
    (lambda: small(offline_cpus={32}), r"offline_cpus has CPUs outside 0..31"),
    (lambda: small(offline_cpus=set(range(32))), "offline_cpus takes every CPU"),
    (lambda: small(offline_cpus={3}, isolcpus={3}), r"both offline and isolated: \[3\]"),
    (lambda: small(distances=DistanceSpec(remote=9)), "distances.remote must be an integer in 11..255"),
    (lambda: small(distances=DistanceSpec(matrix=((10, 20), (20, 10)))), "is 2×2 for 4 NUMA nodes"),
    (lambda: DistanceSpec(matrix=((10, 20), (20, 11))), r"matrix\[1\]\[1\] must be 10"),
    (lambda: DistanceSpec(matrix=((10, 20), (20,))), "must be square"),
    (lambda: small(switches=(PcieSwitchSpec(4, gpus=(GpuSpec(),)),)), "PCIe switch on node 4: not a CPU node"),
    (lambda: PcieSwitchSpec(0), "has no GPU or NIC"),
    (lambda: small(switches=(PcieSwitchSpec(0, gpus=(GpuSpec(),)),),
                   nvlink_bridges=(NvLinkBridgeSpec(0, 1, 4),)), "names GPU 1; this machine has 1 GPUs"),
    (lambda: NvLinkBridgeSpec(2, 2, 4), "joins GPU 2 to itself"),
    (lambda: small(switches=(PcieSwitchSpec(0, gpus=(GpuSpec(), GpuSpec(minor=0))),)), "GPU minors repeat"),
    (lambda: GpuSpec(minor=255), "minor must be in 0..253"),
    (lambda: small(root_port_nics=(RootPortNicSpec(0, NicSpec(name="eth0")),
                                   RootPortNicSpec(1, NicSpec(name="eth0"))),), "NIC names repeat"),
    (lambda: NicSpec(name="a/b"), "not a valid netdev name"),
    (lambda: NicSpec(vfs=-1), "vfs must be a count"),
])
def test_bad_specs_fail_naming_the_field(make, message):
    with pytest.raises(SpecError, match=message):
        make()


@pytest.mark.parametrize("switches, message", [
    ((PcieSwitchSpec(0, gpus=(GpuSpec(),), host_bus=0x20), PcieSwitchSpec(1, gpus=(GpuSpec(),), host_bus=0x22)),
     "0x22-0x25 are taken"),
    ((PcieSwitchSpec(0, gpus=(GpuSpec(),), host_bus=0xFD),), "beyond 0xff"),
])
def test_pci_buses_that_collide_or_overflow_are_refused(switches, message):
    with pytest.raises(SpecError, match=message):
        build_topology(small(switches=switches))


# --- CPU numbering --------------------------------------------------------------------------------

def test_contiguous_numbering_with_x86_sibling_offset():
    t = preset_topology("dgx-h100")
    assert cpus_of(t, 0) == "0-55,112-167"
    assert cpus_of(t, 1) == "56-111,168-223"
    cpu = {c.id: c for c in t.cpus}
    assert cpu[112].core == 0 and cpu[0].core == 0 and cpu[167].core == 55


def test_adjacent_smt_pairs_neighbours():
    t = build_topology(small(smt=SmtLayout.ADJACENT))
    assert cpus_of(t, 0) == "0-7" and cpus_of(t, 3) == "24-31"
    assert {c.id: c.core for c in t.cpus if c.id < 4} == {0: 0, 1: 0, 2: 2, 3: 2}


def test_interleaved_numbering_reproduces_a_gold_6248_in_snc2():
    t = preset_topology("intel-2s-snc2")
    node0 = sorted(t.node(0).cpus)
    assert node0 == [0, 1, 2, 5, 6, 10, 11, 12, 15, 16, 40, 41, 42, 45, 46, 50, 51, 52, 55, 56]
    assert sorted(t.node(1).cpus)[:10] == [3, 4, 7, 8, 9, 13, 14, 17, 18, 19]
    assert {c.socket for c in t.cpus if c.numa in (0, 1)} == {0}
    assert {c.socket for c in t.cpus if c.numa in (2, 3)} == {1}


def test_interleave_chunks_that_overfill_a_node_are_cut_to_fit():
    t = build_topology(small(sockets=1, cores_per_node=3, threads_per_core=1,
                             numbering=Numbering.INTERLEAVED, interleave=(2,)))
    assert cpus_of(t, 0) == "0-1,4" and cpus_of(t, 1) == "2-3,5"


def test_round_robin_visits_nodes_in_the_given_order():
    t = preset_topology("intel-4s")
    assert cpus_of(t, 0).startswith("0,4,8,")
    assert cpus_of(t, 1).startswith("2,6,10,")
    assert cpus_of(t, 2).startswith("1,5,9,")
    assert 41 in t.node(2).cpus  # CPU 1's sibling, 1 + 40 cores
    assert all(len(n.cpus) == 20 for n in t.numa_nodes)


def test_sparse_node_ids_rename_nodes_and_keep_their_cpus():
    t = build_topology(small(node_ids=(0, 1, 33, 34)))
    assert [n.id for n in t.numa_nodes] == [0, 1, 33, 34]
    assert cpus_of(t, 33) == "8-11,24-27"


# --- groups ---------------------------------------------------------------------------------------

def test_l3_groups_of_eight_cores_on_the_epyc_preset():
    t = preset_topology("amd-epyc-2s-nps4")
    groups = Counter(c.l3 for c in t.cpus)
    assert len(groups) == 16 and set(groups.values()) == {16}  # 8 cores × 2 threads each
    cpu = {c.id: c for c in t.cpus}
    assert cpu[7].l3 == 0 and cpu[8].l3 == 8 and cpu[136].l3 == 8


def test_l3_per_socket_by_default_and_die_is_the_lowest_cpu_of_the_socket():
    t = preset_topology("intel-2s-ht")
    assert {c.l3 for c in t.cpus} == {0, 24}
    assert {c.die for c in t.cpus if c.socket == 1} == {24}


def test_offline_cpus_keep_their_node_and_leave_every_group():
    t = build_topology(small(threads_per_core=2, offline_cpus={0, 17}))
    cpu = {c.id: c for c in t.cpus}
    assert not cpu[0].online and cpu[0].numa == 0 and cpu[0].core is None and cpu[0].l3 is None
    assert 0 not in t.node(0).cpus and 17 not in t.node(0).cpus and 16 in t.node(0).cpus
    # The group ids skip offline CPUs, as the kernel drops them from every sibling list.
    assert cpu[16].core == 16 and cpu[1].core == 1
    assert cpu[1].die == 1 and cpu[1].l3 == 1 and cpu[16].die == 1


def test_isolcpus_pass_through():
    assert build_topology(small(isolcpus={2, 3})).isolcpus == {2, 3}


# --- distances and memory -------------------------------------------------------------------------

def test_distance_rule_for_siblings_remote_and_cpuless_nodes():
    spec = small(distances=DistanceSpec(sibling=12, remote=32),
                 cpuless_nodes=(CpulessNodeSpec(8, 16 * GIB, near_node=2, near_distance=80, far_distance=120),
                                CpulessNodeSpec(9, 16 * GIB, near_node=0, far_distance=100)))
    t = build_topology(spec)
    assert dict(t.node(0).distances) == {0: 10, 1: 12, 2: 32, 3: 32, 8: 120, 9: 80}
    assert t.node(8).distances[2] == 80 and t.node(8).distances[9] == 120  # the larger far distance
    assert t.node(8).cpus == frozenset() and t.node(8).memory_bytes == 16 * GIB
    assert all(n.distances[m.id] == m.distances[n.id] for n in t.numa_nodes for m in t.numa_nodes)


def test_explicit_distance_matrix_follows_ascending_node_ids():
    matrix = ((10, 15, 20, 25), (15, 10, 30, 35), (20, 30, 10, 40), (25, 35, 40, 10))
    t = build_topology(small(node_ids=(7, 3, 5, 1), distances=DistanceSpec(matrix=matrix)))
    assert dict(t.node(1).distances) == {1: 10, 3: 15, 5: 20, 7: 25}
    assert t.node(7).distances[5] == 40


def test_memory_hugepages_and_memoryless_nodes():
    spec = small(memory=MemorySpec(8 * GIB, hugepages={2048: 100, 1048576: 2}, memoryless_nodes={1}))
    t = build_topology(spec)
    node0 = t.node(0)
    assert node0.memory_bytes == 8 * GIB
    assert {k: (v.total, v.free) for k, v in node0.hugepages.items()} == {2048: (100, 100), 1048576: (2, 2)}
    assert t.node(1).memory_bytes == 0 and t.node(1).hugepages[2048].total == 0
    assert t.node(1).cpus  # memoryless, not CPU-less


# --- devices --------------------------------------------------------------------------------------

def test_dgx_gpus_sit_on_the_listed_buses_behind_a_switch_shared_with_a_nic():
    t = preset_topology("dgx-h100")
    assert [g.pci_address[5:7] for g in t.gpus] == ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    gpu0 = t.pci("0000:1b:00.0")
    assert (gpu0.class_code, gpu0.vendor, gpu0.device) == (0x030200, 0x10DE, 0x2330)
    assert gpu0.bridges == ("0000:17:01.0", "0000:18:00.0", "0000:19:01.0")
    assert gpu0.host_bridge == "pci0000:17" and gpu0.driver == "nvidia"
    nic = t.pci("0000:1a:00.0")
    assert (nic.class_code, nic.vendor, nic.device) == (0x020700, 0x15B3, 0x1021)
    assert nic.bridges[:2] == gpu0.bridges[:2] and nic.bridges[2] != gpu0.bridges[2]
    assert [n.name for n in t.nics if n.pci_address == "0000:1a:00.0"] == ["ibp26s0"]
    assert sorted(r for n in t.nics for r in n.rdma) == sorted(f"mlx5_{i}" for i in range(8))
    assert sum(d.class_code == 0x068000 for d in t.pci_devices) == 4


def test_every_device_below_a_root_port_is_local_to_its_node():
    for name in PRESETS:
        t = preset_topology(name)
        by_address = {d.address: d for d in t.pci_devices}
        for d in t.pci_devices:
            assert d.local_cpus == t.node(d.numa_node).cpus
            for bridge in d.bridges:
                assert by_address[bridge].numa_node == d.numa_node
                assert by_address[bridge].class_code == 0x060400


def test_gpu_links_on_nvswitch_and_bridged_machines():
    dgx = preset_topology("dgx-h100")
    for g in dgx.gpus:
        assert g.nvswitch_links == 18
        assert dict(g.nvlink_peers) == {o.pci_address: 18 for o in dgx.gpus if o is not g}
    epyc = preset_topology("amd-epyc-2s-nps4")
    g0, g1 = epyc.gpus[0], epyc.gpus[1]
    assert dict(g0.nvlink_peers) == {g1.pci_address: 12} and dict(g1.nvlink_peers) == {g0.pci_address: 12}
    assert [g.numa_node for g in epyc.gpus] == [3, 2, 1, 0, 7, 6, 5, 4]
    assert all(not g.nvlink_peers for g in preset_topology("pcie-4gpu").gpus)


def test_gpu_pcie_levels_follow_the_switches():
    t = preset_topology("pcie-4gpu")
    g = t.gpus
    assert g[0].pcie[g[1].pci_address] == "single"  # the same switch
    assert g[0].pcie[g[2].pci_address] == "system"  # across sockets
    dgx = preset_topology("dgx-h100").gpus
    assert dgx[0].pcie[dgx[1].pci_address] == "node" and dgx[0].pcie[dgx[4].pci_address] == "system"
    assert all(g.pci_address not in g.pcie and len(g.pcie) == 7 for g in dgx)


def test_gpu_uuids_are_stable_distinct_and_nvml_shaped():
    t = preset_topology("dgx-h100")
    uuids = [g.uuid for g in t.gpus]
    assert uuids == [gpu_uuid("dgx-h100", i) for i in range(8)]
    assert len(set(uuids)) == 8 and all(u.startswith("GPU-") and len(u) == 40 for u in uuids)
    assert gpu_uuid("pcie-4gpu", 0) not in uuids


def test_gpu_minors_need_not_follow_the_index():
    assert [g.minor for g in preset_topology("dgx-h100").gpus] == [2, 3, 0, 1, 6, 7, 4, 5]
    t = build_topology(small(switches=(PcieSwitchSpec(0, gpus=(GpuSpec(), GpuSpec())),)))
    assert [g.minor for g in t.gpus] == [0, 1]


def test_sriov_vfs_share_the_pf_bus_and_get_their_own_netdevs():
    t = preset_topology("intel-2s-ht")
    pf = next(n for n in t.nics if n.name == "ens1f0")
    assert pf.vfs == ("0000:11:00.1", "0000:11:00.2", "0000:11:00.3", "0000:11:00.4")
    assert t.pci(pf.pci_address).virtfns == pf.vfs
    vf = t.pci("0000:11:00.3")
    assert vf.physfn == pf.pci_address and vf.device == 0x101E and vf.numa_node == 0
    assert [n.name for n in t.nics if n.pci_address in pf.vfs] == [f"ens1f0v{i}" for i in range(4)]
    assert pf.rdma == ("mlx5_0",)


def test_predictable_names_and_automatic_buses():
    spec = small(root_port_nics=(RootPortNicSpec(0, NicSpec(NicKind.ETHERNET, rdma=False)),),
                 nvswitches=(NvSwitchSpec(1),), switches=(PcieSwitchSpec(2, nics=(NicSpec(),)),))
    t = build_topology(spec)
    assert {n.name: n.pci_address for n in t.nics} == {"ibp19s0": "0000:13:00.0", "enp21s0f0np0": "0000:15:00.0"}
    assert next(n for n in t.nics if n.name == "enp21s0f0np0").rdma == ()
    assert t.pci("0000:17:00.0").class_code == 0x068000 and t.pci("0000:17:00.0").numa_node == 1


# --- presets --------------------------------------------------------------------------------------

def test_the_preset_names_the_cli_documents():
    assert set(PRESETS) >= {"intel-2s-ht", "intel-2s-snc2", "amd-epyc-2s-nps4", "intel-4s", "dgx-h100",
                            "pcie-4gpu", "numa64-1024"}
    for name, preset in PRESETS.items():
        assert preset.name == name == preset.spec.name
        assert preset.summary and "\n" not in preset.summary and len(preset.summary) <= 100


@pytest.mark.parametrize("name, cpus, nodes, gpus", [
    ("intel-2s-ht", 96, 2, 0), ("intel-2s-snc2", 80, 4, 0), ("amd-epyc-2s-nps4", 256, 8, 8),
    ("intel-4s", 80, 4, 0), ("dgx-h100", 224, 2, 8), ("pcie-4gpu", 64, 2, 4), ("numa64-1024", 1024, 64, 0),
])
def test_preset_sizes(name, cpus, nodes, gpus):
    t = preset_topology(name)
    assert (len(t.cpus), len(t.numa_nodes), len(t.gpus)) == (cpus, nodes, gpus)
    assert t.warnings == ()


def test_preset_distances():
    assert dict(preset_topology("intel-2s-snc2").node(0).distances) == {0: 10, 1: 11, 2: 21, 3: 21}
    epyc = preset_topology("amd-epyc-2s-nps4").node(0).distances
    assert (epyc[0], epyc[3], epyc[4]) == (10, 12, 32)
    big = preset_topology("numa64-1024").node(9).distances
    assert Counter(big.values()) == {10: 1, 12: 7, 32: 56}
    assert cpus_of(preset_topology("amd-epyc-2s-nps4"), 5) == "80-95,208-223"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_survive_json_and_are_rebuilt_identically(name):
    t = preset_topology(name)
    assert Topology.from_json(t.to_json()) == t
    assert build_topology(PRESETS[name].spec) == t


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(KeyError) as e:
        preset_topology("dgx-a100")
    message = e.value.args[0]
    assert "dgx-a100" in message and all(name in message for name in PRESETS)

