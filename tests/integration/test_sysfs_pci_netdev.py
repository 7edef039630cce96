"""PCI hierarchy, SR-IOV and netdev mapping on small built trees, and the netlink merge."""

from __future__ import annotations

from pathlib import Path

import pyroute2
import pytest

from nri_numa.topology import netdev, pci
from nri_numa.topology.parts import Nic, PciDevice, pcie_level
from tests.integration.sysfs_tree import (Function, add_netdev, add_sriov, build_pci, link,
                                          write)
from tests.tmpfs import fast_tmp

ROOT_PORT = Function("pci0000:3a/0000:3a:00.0", class_code=0x060400, driver="pcieport")
SWITCH_UP = Function(f"{ROOT_PORT.path}/0000:3b:00.0", class_code=0x060400, driver="pcieport")
SWITCH_DOWN = [Function(f"{SWITCH_UP.path}/0000:3c:{d:02x}.0", class_code=0x060400,
                        driver="pcieport") for d in (0, 1)]
GPU = Function(f"{SWITCH_DOWN[0].path}/0000:3d:00.0", class_code=0x030200, vendor=0x10DE,
               device=0x2330, driver="nvidia")
PF = Function(f"{SWITCH_DOWN[1].path}/0000:3e:00.0")
VFS = [Function(f"{SWITCH_DOWN[1].path}/0000:3e:{1 + n // 8:02x}.{n % 8}", device=0x101E,
                numa_node=-1) for n in range(11)]
VIRTIO = Function("pci0000:00/0000:00:03.0", vendor=0x1AF4, device=0x1041, numa_node=-1,
                  driver="virtio-pci")
VMD_DISK = Function("pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/10000:e1:00.0",
                    class_code=0x010802, vendor=0x144D, device=0xA80A, driver="nvme")


@pytest.fixture
def root(tmp_path) -> Path:
    with fast_tmp(tmp_path) as base:
        build_pci(base, [ROOT_PORT, SWITCH_UP, *SWITCH_DOWN, GPU, PF, *VFS, VIRTIO])
        add_sriov(base, PF, VFS)
        write(base, f"sys/devices/{PF.path}/infiniband/mlx5_0/node_type", "1: CA\n")
        add_netdev(base, "ens3f0", PF.path)
        add_netdev(base, "ens3f0v10", VFS[10].path)
        add_netdev(base, "eth0", f"{VIRTIO.path}/virtio2")
        add_netdev(base, "lo", "virtual/net")
        yield base


def devices_of(root: Path) -> tuple[dict[str, PciDevice], list[str]]:
    warnings: list[str] = []
    return {d.address: d for d in pci.read_pci_devices(root, warnings)}, warnings


def test_bridges_are_the_path_from_the_host_bridge(root):
    devices, warnings = devices_of(root)
    assert warnings == []
    gpu = devices[GPU.address]
    assert gpu.host_bridge == "pci0000:3a"
    assert gpu.bridges == ("0000:3a:00.0", "0000:3b:00.0", "0000:3c:00.0")
    assert (gpu.class_code, gpu.vendor, gpu.device, gpu.driver) == \
        (0x030200, 0x10DE, 0x2330, "nvidia")
    assert devices[ROOT_PORT.address].bridges == ()
    # GPU and NIC sit behind one switch, on different downstream ports.
    assert pcie_level(gpu, devices[PF.address]) == "single"


def test_sriov_links_in_virtfn_order(root):
    devices, _ = devices_of(root)
    pf = devices[PF.address]
    # virtfn10 comes after virtfn2: ordered by N, not by name.
    assert pf.virtfns == tuple(vf.address for vf in VFS)
    assert pf.virtfns[10] == "0000:3e:02.2"
    assert all(devices[vf.address].physfn == PF.address for vf in VFS)
    assert devices[VFS[3].address].numa_node == 0  # -1, so the switch port's node


def test_vmd_domain_keeps_the_vmd_function_as_a_bridge(tmp_path):
    with fast_tmp(tmp_path) as base:
        build_pci(base, [VMD_DISK])
        devices, warnings = devices_of(base)
    disk = devices[VMD_DISK.address]
    assert warnings == []
    assert disk.host_bridge == "pci0000:00"
    assert disk.bridges == ("0000:00:0e.0", "10000:e0:06.0")


def test_nics_pf_vf_virtio_and_rdma(root):
    devices, _ = devices_of(root)
    warnings: list[str] = []
    nics = netdev.read_nics(root, tuple(devices.values()), warnings, netlink=False)
    assert warnings == []
    assert nics == (
        Nic("ens3f0", PF.address, vfs=tuple(vf.address for vf in VFS), rdma=("mlx5_0",)),
        Nic("ens3f0v10", VFS[10].address),
        Nic("eth0", VIRTIO.address),  # via virtio2, a child of the PCI function
    )


def test_old_kernel_class_net_directory_with_device_link(tmp_path):
    # Before sysfs class links, /sys/class/net/eth1 was a directory holding a device link.
    with fast_tmp(tmp_path) as base:
        build_pci(base, [VIRTIO])
        write(base, "sys/class/net/eth1/ifindex", "3\n")
        link(base, "sys/class/net/eth1/device", f"../../../devices/{VIRTIO.path}")
        warnings: list[str] = []
        nics = netdev.read_nics(base, pci.read_pci_devices(base, warnings), warnings,
                                netlink=False)
    assert warnings == [] and nics == (Nic("eth1", VIRTIO.address),)


def test_uppercase_entry_names_give_lowercase_addresses(tmp_path):
    with fast_tmp(tmp_path) as base:
        build_pci(base, [Function("pci0000:af/0000:af:00.0")])
        devices_dir = base / "sys/bus/pci/devices"
        (devices_dir / "0000:af:00.0").rename(devices_dir / "0000:AF:00.0")
        devices, warnings = devices_of(base)
    assert warnings == [] and list(devices) == ["0000:af:00.0"]


# --- netlink ------------------------------------------------------------------------------------

class FakeLink:
    def __init__(self, name: str, parent: str | None, bus: str | None) -> None:
        self.attrs = {"IFLA_IFNAME": name, "IFLA_PARENT_DEV_NAME": parent,
                      "IFLA_PARENT_DEV_BUS_NAME": bus}

    def get_attr(self, name: str):
        return self.attrs.get(name)


def fake_iproute(links: list[FakeLink]):
    class FakeIPRoute:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def get_links(self):
            return tuple(links)

    return FakeIPRoute


def test_netlink_adds_pci_links_of_this_namespace(root, monkeypatch):
    # ens3f1 lives in our namespace but not in the sysfs we see (mounted from another one).
    monkeypatch.setattr(pyroute2, "IPRoute", fake_iproute([
        FakeLink("lo", None, None),
        FakeLink("eth0", "virtio2", "virtio"),
        FakeLink("ens3f1", VFS[1].address.upper(), "pci"),
        FakeLink("ens9", "0000:99:00.0", "pci"),  # a function this tree does not have
    ]))
    devices, _ = devices_of(root)
    warnings: list[str] = []
    nics = netdev.read_nics(root, tuple(devices.values()), warnings, netlink=True)
    assert warnings == []
    assert [(n.name, n.pci_address) for n in nics] == [
        ("ens3f0", PF.address), ("ens3f0v10", VFS[10].address),
        ("ens3f1", VFS[1].address), ("eth0", VIRTIO.address)]


def test_netlink_failure_falls_back_to_sysfs(root, monkeypatch):
    class BrokenIPRoute:
        def __init__(self):
            raise OSError(93, "Protocol not supported")

    monkeypatch.setattr(pyroute2, "IPRoute", BrokenIPRoute)
    devices, _ = devices_of(root)
    warnings: list[str] = []
    nics = netdev.read_nics(root, tuple(devices.values()), warnings, netlink=True)
    assert [n.name for n in nics] == ["ens3f0", "ens3f0v10", "eth0"]
    assert warnings == ["netlink link listing failed (OSError: [Errno 93] Protocol not "
                        "supported); using sysfs alone for network interfaces"]
