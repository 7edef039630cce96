"""The kubelet's devices → NUMA hints: its topology first, else the machine's by device id."""

from __future__ import annotations

import pytest

from nri_numa.podresources.hints import DeviceNodes, container_hints, find_container, pci_address
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice

GPU0, GPU1 = "GPU-aaaa-node0", "GPU-bbbb-node1"


def machine() -> Topology:
    cpus = tuple(Cpu(id=i, numa=i // 2, core=i, socket=i // 2) for i in range(4))
    nodes = tuple(NumaNode(id=n, cpus=frozenset({2 * n, 2 * n + 1}), memory_bytes=1 << 30)
                  for n in range(2))
    pci = (PciDevice("0000:17:00.0", 0, 0x030200, 0x10DE, 0x2330),
           PciDevice("0000:81:00.0", 1, 0x030200, 0x10DE, 0x2330),
           PciDevice("0000:3b:02.1", 1, 0x020000, 0x8086, 0x154C))
    gpus = (Gpu(0, GPU0, "0000:17:00.0", 0, 0), Gpu(1, GPU1, "0000:81:00.0", 1, 1))
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=pci, gpus=gpus)


DEVICES = DeviceNodes(machine())


def group(resource: str, *ids: str, numa: tuple[int, ...] | None = None) -> pr.ContainerDevices:
    g = pr.ContainerDevices(resource_name=resource, device_ids=ids)
    if numa is not None:
        g.topology.nodes.extend(pr.NUMANode(ID=n) for n in numa)
    return g


def hints(*groups: pr.ContainerDevices) -> dict[str, frozenset[int]]:
    return container_hints(pr.ContainerResources(name="main", devices=groups), DEVICES)


def test_the_device_plugins_topology_is_taken_as_given() -> None:
    # Ids the machine does not know do not matter when the kubelet reports the nodes.
    assert hints(group("nvidia.com/gpu", "whatever", numa=(1,))) == {"nvidia.com/gpu": {1}}
    assert hints(group("example.com/fpga", "a", numa=(0,)), group("example.com/fpga", "b", numa=(1,))) \
        == {"example.com/fpga": {0, 1}}


def test_the_kubelets_topology_wins_over_what_the_ids_say() -> None:
    assert hints(group("nvidia.com/gpu", GPU0, numa=(1,))) == {"nvidia.com/gpu": {1}}


@pytest.mark.parametrize("resource, device_id, node", [
    ("nvidia.com/gpu", GPU1, 1),                       # DEVICE_ID_STRATEGY=uuid
    ("nvidia.com/gpu", GPU1.upper(), 1),
    ("nvidia.com/gpu", f"{GPU0}::3", 0),               # time-slicing replica
    ("nvidia.com/gpu", "1", 1),                         # DEVICE_ID_STRATEGY=index
    ("nvidia.com/gpu", "00000000:81:00.0", 1),          # NVML's PCI bus id
    ("intel.com/sriov_netdevice", "0000:3b:02.1", 1),   # SR-IOV device plugin
    ("amd.com/gpu", "0000:17:00.0", 0),
])
def test_without_topology_device_ids_are_found_in_the_machine(resource, device_id, node) -> None:
    assert hints(group(resource, device_id)) == {resource: {node}}


@pytest.mark.parametrize("resource, device_id", [
    ("example.com/thing", "1"),            # an index means nothing outside nvidia.com/gpu
    ("nvidia.com/gpu", "GPU-unknown"),
    ("nvidia.com/gpu", "7"),
    ("intel.com/sriov", "0000:99:00.0"),   # not on this machine
    ("nvidia.com/gpu", "MIG-1234"),
])
def test_unknown_devices_give_no_hint(resource, device_id) -> None:
    assert hints(group(resource, device_id)) == {}


def test_nodes_the_machine_lacks_are_dropped() -> None:
    assert hints(group("nvidia.com/gpu", "x", numa=(1, 5))) == {"nvidia.com/gpu": {1}}
    assert hints(group("nvidia.com/gpu", "x", numa=(7,))) == {}
    assert hints(group("nvidia.com/gpu", "x", numa=(-1,))) == {}


def test_groups_without_a_resource_name_are_ignored() -> None:
    assert hints(group("", GPU1)) == {}


def test_pci_addresses_in_sysfs_form() -> None:
    assert pci_address("00000000:81:00.0") == "0000:81:00.0"
    assert pci_address("0000:81:00.0") == "0000:81:00.0"
    assert pci_address("00010000:81:00.0") == "00010000:81:00.0"  # a domain that needs the digits
    assert pci_address("81:00.0") is None and pci_address("0000:81:00.8") is None


def test_the_container_is_found_by_namespace_pod_and_name() -> None:
    pods = [pr.PodResources(namespace="a", name="p", containers=[pr.ContainerResources(name="c")]),
            pr.PodResources(namespace="b", name="p", containers=[pr.ContainerResources(name="c"),
                                                                 pr.ContainerResources(name="d")])]
    assert find_container(pods, "b", "p", "d") is pods[1].containers[1]
    assert find_container(pods, "a", "p", "d") is None
    assert find_container(pods, "c", "p", "c") is None



def claim(driver: str, device: str, *cdi: str) -> pr.DynamicResource:
    return pr.DynamicResource(claim_name="c", claim_namespace="ns", claim_resources=[
        pr.ClaimResource(driver_name=driver, pool_name="node-a", device_name=device,
                         cdi_devices=[pr.CDIDevice(name=n) for n in cdi])])


def test_a_dra_claims_device_is_found_by_its_name_else_by_its_cdi_names() -> None:
    asked: list[list[str]] = []

    def cdi_nodes(names):
        asked.append(list(names))
        return frozenset({1, 7})  # node 7 is not on this machine: dropped

    container = pr.ContainerResources(name="main", dynamic_resources=[
        claim("gpu.example.com", GPU0),
        claim("nic.example.com", "vf-3", "nic.example.com/vf=vf-3")])
    assert container_hints(container, DEVICES, cdi_nodes) == {
        "gpu.example.com": frozenset({0}), "nic.example.com": frozenset({1})}
    assert asked == [["nic.example.com/vf=vf-3"]]  # a device found by name is not looked up
    # Without a resolver, a device named in no way the machine knows gives no hint.
    assert container_hints(container, DEVICES) == {"gpu.example.com": frozenset({0})}
