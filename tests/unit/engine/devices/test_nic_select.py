"""NICs by PCIe proximity to the container's GPUs: tiers, balance across GPUs, id forms."""

from __future__ import annotations

import pytest
from device_boxes import NIC_CLASS, behind_switch, dgx_a100_like, dgx_h100, numa_nodes, pci

from nri_numa.engine.devices.nic_select import nic_chooser, nic_pci, select_nics
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Gpu, Nic

H100_NICS = [f"mlx5_{i}" for i in range(10)]


def gpu_addresses(t: Topology, *indices: int) -> list[str]:
    return [g.pci_address for g in t.gpus if g.index in indices]


@pytest.mark.parametrize("gpus,size,expected", [
    ([2], 1, ["mlx5_2"]),  # the NIC behind the GPU's own switch
    ([0, 1], 2, ["mlx5_0", "mlx5_1"]),
    ([5], 2, ["mlx5_5", "mlx5_4"]),  # then same NUMA node (node 1), lowest id
    ([0], 3, ["mlx5_0", "mlx5_1", "mlx5_2"]),  # node 0: GPU NICs and storage NICs tie
    ([4, 5, 6, 7], 4, ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]),
    ([], 2, ["mlx5_0", "mlx5_1"]),  # no GPUs: by id
])
def test_dgx_h100(gpus, size, expected):
    t = dgx_h100()
    assert nic_chooser(t, gpu_addresses(t, *gpus))(H100_NICS, [], size) == expected


def test_tiers_run_switch_then_host_bridge_then_node_then_anything():
    cpus, nodes = numa_nodes(2)
    devices = (
        behind_switch("0000:02:00.0", 0, "0000:00:01.0", "0000:01:00", "pci0000:00"),  # GPU
        behind_switch("0000:03:00.0", 0, "0000:00:01.0", "0000:01:00", "pci0000:00",
                      NIC_CLASS),  # same switch
        pci("0000:05:00.0", 0, ("0000:00:02.0",), "pci0000:00", NIC_CLASS),  # same host bridge
        pci("0000:41:00.0", 0, ("0000:40:01.0",), "pci0000:40", NIC_CLASS),  # same node
        pci("0000:81:00.0", 1, ("0000:80:01.0",), "pci0000:80", NIC_CLASS),  # other socket
        pci("0000:c1:00.0", None, ("0000:c0:01.0",), "pci0000:c0", NIC_CLASS),  # unknown node
    )
    nics = tuple(Nic(name=f"eth{i}", pci_address=d.address) for i, d in enumerate(devices[1:]))
    gpu = Gpu(index=0, uuid="GPU-0", pci_address=devices[0].address, numa_node=0)
    t = Topology(cpus=cpus, numa_nodes=nodes, pci_devices=devices, nics=nics, gpus=(gpu,))
    # ids deliberately in reverse, and an unknown one: tiers decide, unknown last
    ids = ["eth4", "eth3", "eth2", "eth1", "eth0", "ghost"]
    assert nic_chooser(t, ["GPU-0"])(ids, [], 6) == ["eth0", "eth1", "eth2", "eth3", "eth4",
                                                     "ghost"]


def test_gpus_on_two_switches_get_one_nic_each():
    t = dgx_a100_like()  # GPUs 0,1 + ib0, ib1 on switch A; GPUs 2,3 + ib2, ib3 on switch B
    choose = nic_chooser(t, gpu_addresses(t, 0, 2))
    assert choose(["ib0", "ib1", "ib2", "ib3"], [], 2) == ["ib0", "ib2"]
    assert choose(["ib0", "ib1", "ib2", "ib3"], [], 3) == ["ib0", "ib2", "ib1"]
    # must-include NICs count towards their GPU's share
    assert choose(["ib0", "ib1", "ib2", "ib3"], ["ib1"], 2) == ["ib1", "ib2"]


def test_nic_ids_in_every_form():
    t = dgx_h100()
    nic3 = t.pci(next(n.pci_address for n in t.nics if n.name == "ibp3"))
    assert nic_pci(t, "ibp3") == nic3
    assert nic_pci(t, "mlx5_3") == nic3
    assert nic_pci(t, nic3.address) == nic3
    assert nic_pci(t, nic3.address.upper()) == nic3
    assert nic_pci(t, "nothing") is None


def test_virtual_function_without_pci_entry_stands_in_as_its_pf():
    t = dgx_h100()
    pf = next(n for n in t.nics if n.name == "ibp6")
    with_vf = Topology(cpus=t.cpus, numa_nodes=t.numa_nodes, pci_devices=t.pci_devices,
                       nics=tuple(Nic(n.name, n.pci_address, vfs=("0000:e0:00.2",), rdma=n.rdma)
                                  if n is pf else n for n in t.nics), gpus=t.gpus)
    assert nic_pci(with_vf, "0000:e0:00.2") == t.pci(pf.pci_address)
    choose = nic_chooser(with_vf, gpu_addresses(t, 6))
    assert choose(["0000:e0:00.2", "mlx5_7"], [], 1) == ["0000:e0:00.2"]


def test_gpu_missing_from_the_pci_list_still_anchors_by_numa_node():
    t = dgx_h100()
    gpu7 = next(g for g in t.gpus if g.index == 7)
    without = Topology(cpus=t.cpus, numa_nodes=t.numa_nodes, nics=t.nics, gpus=t.gpus,
                       pci_devices=tuple(d for d in t.pci_devices if d.address != gpu7.pci_address))
    # only the NUMA node is known: node-1 NICs tie, node-0 ones come after
    assert nic_chooser(without, [gpu7.uuid])(["mlx5_0", "mlx5_7", "mlx5_4"], [], 2) == [
        "mlx5_4", "mlx5_7"]


def test_bad_requests():
    t = dgx_h100()
    with pytest.raises(ValueError, match="2 NICs must be included but only 1"):
        select_nics({i: nic_pci(t, i) for i in H100_NICS}, [], 1, ["mlx5_0", "mlx5_1"])
    with pytest.raises(ValueError, match=r"must-include NICs \['mlx5_99'\] are not among"):
        select_nics({"mlx5_0": nic_pci(t, "mlx5_0")}, [], 1, ["mlx5_99"])


def test_fewer_nics_than_asked_returns_what_there_is():
    t = dgx_h100()
    assert nic_chooser(t)(["mlx5_1", "mlx5_0"], [], 5) == ["mlx5_0", "mlx5_1"]
