"""Devices a container already has → NUMA hints and the ids it holds: sysfs links to PCI
functions, NVIDIA nodes by minor, NVIDIA_VISIBLE_DEVICES by UUID or index."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_numa.engine.devices import Device, Resource
from nri_numa.runtime import DeviceLocator, DeviceNode, RuntimeContainer, RuntimePod
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice

NVME_PCI = "0000:41:00.0"
NIC_PCI = "0000:c1:00.1"
UNKNOWN_PCI = "0000:e1:00.0"  # in sysfs but not in the topology
NO_NODE_PCI = "0000:05:00.0"  # the firmware gives no node


def _machine() -> Topology:
    cpus = tuple(Cpu(id=i, numa=i // 2, core=i, socket=0) for i in range(4))
    nodes = tuple(NumaNode(id=n, cpus=frozenset({2 * n, 2 * n + 1}), memory_bytes=1 << 30)
                  for n in range(2))
    pci = tuple(PciDevice(address=a, numa_node=n, class_code=0x010802, vendor=0x144D, device=1)
                for a, n in ((NVME_PCI, 1), (NIC_PCI, 0), (NO_NODE_PCI, None),
                             ("0000:17:00.0", 0), ("0000:b1:00.0", 1)))
    gpus = (Gpu(index=0, uuid="GPU-aaaa", pci_address="0000:17:00.0", numa_node=0, minor=3),
            Gpu(index=1, uuid="GPU-bbbb", pci_address="0000:b1:00.0", numa_node=1, minor=0))
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=pci, gpus=gpus)


def _link(root: Path, kind: str, number: str, device_dir: str) -> None:
    target = root / "sys" / "devices" / device_dir
    target.mkdir(parents=True)
    link = root / "sys" / "dev" / kind / number
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    _link(tmp_path, "block", "259:0", f"pci0000:40/0000:40:01.1/{NVME_PCI}/nvme/nvme0/nvme0n1")
    _link(tmp_path, "char", "231:64", f"pci0000:c0/0000:c0:03.1/{NIC_PCI}/infiniband_verbs/uverbs0")
    _link(tmp_path, "char", "10:229", "virtual/misc/fuse")
    _link(tmp_path, "char", "240:1", f"pci0000:e0/{UNKNOWN_PCI}/thing")
    _link(tmp_path, "char", "241:0", f"pci0000:00/{NO_NODE_PCI}/thing")
    return tmp_path


def _container(*devices: DeviceNode, env: dict[str, str] | None = None) -> RuntimeContainer:
    return RuntimeContainer(id="c", name="c", pod=RuntimePod(id="p"), devices=devices,
                            env=env or {})


def test_block_and_char_devices_follow_sysfs_to_their_pci_node(sysfs):
    locator = DeviceLocator(_machine(), sysfs)
    hints = locator.numa_hints(_container(DeviceNode("/dev/nvme0n1", "b", 259, 0),
                                          DeviceNode("/dev/infiniband/uverbs0", "c", 231, 64)))
    assert hints == {"/dev/nvme0n1": {1}, "/dev/infiniband/uverbs0": {0}}


@pytest.mark.parametrize("device", [
    DeviceNode("/dev/fuse", "c", 10, 229),  # virtual: no locality
    DeviceNode("/dev/thing", "c", 240, 1),  # PCI function the topology does not know
    DeviceNode("/dev/other", "c", 241, 0),  # PCI function without a node
    DeviceNode("/dev/gone", "c", 99, 9),  # no sysfs entry at all
    DeviceNode("/dev/nvme0n1", "c", 259, 0),  # same numbers, wrong kind: char 259:0 is absent
    DeviceNode("/dev/fifo", "p", 0, 0),
])
def test_devices_without_locality_give_no_hint(sysfs, device):
    assert DeviceLocator(_machine(), sysfs).numa_hints(_container(device)) == {}


def test_nvidia_nodes_are_gpus_by_minor(sysfs):
    locator = DeviceLocator(_machine(), sysfs)
    hints = locator.numa_hints(_container(DeviceNode("/dev/nvidia3", "c", 195, 3),
                                          DeviceNode("/dev/nvidiactl", "c", 195, 255),
                                          DeviceNode("/dev/nvidia-uvm", "c", 511, 0)))
    assert hints == {"nvidia.com/gpu": {0}}
    both = locator.numa_hints(_container(DeviceNode("/dev/nvidia3", "c", 195, 3),
                                         DeviceNode("/dev/nvidia0", "c", 195, 0)))
    assert both == {"nvidia.com/gpu": {0, 1}}


@pytest.mark.parametrize("value, nodes", [
    ("GPU-bbbb", {1}), ("0", {0}), ("1,GPU-aaaa", {0, 1}), (" GPU-aaaa ", {0}),
    ("all", None), ("none", None), ("void", None), ("", None), ("MIG-1234", None),
    ("GPU-unknown", None), ("7", None), ("1:0", {1}), ("0:2,GPU-bbbb", {0, 1}), ("7:0", None),
    ("0:", None), (":1", None),
])
def test_nvidia_visible_devices(sysfs, value, nodes):
    hints = DeviceLocator(_machine(), sysfs).numa_hints(
        _container(env={"NVIDIA_VISIBLE_DEVICES": value}))
    assert hints == ({} if nodes is None else {"nvidia.com/gpu": nodes})


def test_lookups_are_cached(sysfs):
    locator = DeviceLocator(_machine(), sysfs)
    nvme = _container(DeviceNode("/dev/nvme0n1", "b", 259, 0))
    assert locator.numa_hints(nvme) == {"/dev/nvme0n1": {1}}
    (sysfs / "sys" / "dev" / "block" / "259:0").unlink()
    assert locator.numa_hints(nvme) == {"/dev/nvme0n1": {1}}


def test_held_devices_are_named_as_the_resources_name_them(sysfs):
    """GPUs by UUID (minor, NVIDIA_VISIBLE_DEVICES), PCI functions by address; a device no
    resource lists is left out."""
    resources = {"nvidia.com/gpu": Resource("nvidia.com/gpu", (Device("GPU-aaaa"),
                                                               Device("GPU-bbbb"))),
                 "pci/15b3:1021": Resource("pci/15b3:1021", (Device(NIC_PCI),))}
    container = _container(DeviceNode("/dev/nvidia3", "c", 195, 3),
                           DeviceNode("/dev/infiniband/uverbs0", "c", 231, 64),
                           DeviceNode("/dev/nvme0n1", "b", 259, 0),
                           env={"NVIDIA_VISIBLE_DEVICES": "1"})
    held = DeviceLocator(_machine(), sysfs).held_devices(container, resources)
    assert held == {"nvidia.com/gpu": {"GPU-aaaa", "GPU-bbbb"}, "pci/15b3:1021": {NIC_PCI}}
    assert DeviceLocator(_machine(), sysfs).held_devices(_container(), resources) == {}
    # A MIG instance is a part of its GPU: a hint towards the GPU's node, never the GPU held.
    mig = _container(env={"NVIDIA_VISIBLE_DEVICES": "0:1"})
    assert DeviceLocator(_machine(), sysfs).numa_hints(mig) == {"nvidia.com/gpu": {0}}
    assert DeviceLocator(_machine(), sysfs).held_devices(mig, resources) == {}
    # Its GPU's node, which a MIG instance also brings, does not make it the whole GPU...
    with_node = _container(DeviceNode("/dev/nvidia3", "c", 195, 3),
                           env={"NVIDIA_VISIBLE_DEVICES": "0:1"})
    assert DeviceLocator(_machine(), sysfs).held_devices(with_node, resources) == {}
    # ...unless the whole GPU is named too.
    whole = _container(DeviceNode("/dev/nvidia3", "c", 195, 3),
                       env={"NVIDIA_VISIBLE_DEVICES": "0:1,GPU-aaaa"})
    assert DeviceLocator(_machine(), sysfs).held_devices(whole, resources) == {
        "nvidia.com/gpu": {"GPU-aaaa"}}


@pytest.mark.parametrize("bad, message", [
    (dict(path="", type="c", major=1, minor=1), "device path"),
    (dict(path="/dev/x", type="x", major=1, minor=1), "type 'x'"),
    (dict(path="/dev/x", type="c", major=-1, minor=1), "major"),
    (dict(path="/dev/x", type="c", major=1, minor="1"), "minor"),
])
def test_bad_device_nodes_are_named(bad, message):
    from nri_numa.runtime import RuntimeInputError

    with pytest.raises(RuntimeInputError, match=message):
        DeviceNode(**bad)
