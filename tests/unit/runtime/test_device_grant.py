"""Allocated devices → device nodes, allow rules and env, looked up on real device nodes made
with mknod in a temporary dev root, real sysfs-style uverbs files and a /proc/driver/nvidia tree."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from nri_numa.runtime import DeviceGranter, GrantedNode, GrantError
from nri_numa.runtime.device_grant import NVIDIA_MAJOR, UVERBS_CLASS
from nri_numa.topology.nvidia_proc import GPUS_DIR
from nri_numa.topology.synthetic import preset_topology

DGX = preset_topology("dgx-h100")
CX7 = "pci/15b3:1021"
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-proc" / "information-h100.txt"


def _mknod(dev: Path, name: str, major: int, minor: int, kind: int = stat.S_IFCHR) -> None:
    path = dev / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | kind, os.makedev(major, minor))


def test_gpus_get_their_nodes_the_drivers_shared_nodes_and_env(tmp_path):
    gpu = DGX.gpus[0]
    _mknod(tmp_path, f"nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor)
    _mknod(tmp_path, "nvidiactl", NVIDIA_MAJOR, 255)
    _mknod(tmp_path, "nvidia-uvm", 508, 0)  # uvm's major is given out at load time
    (tmp_path / "nvidia-uvm-tools").write_text("")  # not a device node: left out
    other = DGX.gpus[1]  # its node is missing on the host: the driver's major is assumed
    grant = DeviceGranter(DGX, tmp_path).grant({"nvidia.com/gpu": (gpu.uuid, other.uuid)})
    assert grant.nodes == (GrantedNode(f"/dev/nvidia{gpu.minor}", "c", NVIDIA_MAJOR, gpu.minor),
                           GrantedNode(f"/dev/nvidia{other.minor}", "c", NVIDIA_MAJOR,
                                       other.minor),
                           GrantedNode("/dev/nvidiactl", "c", NVIDIA_MAJOR, 255),
                           GrantedNode("/dev/nvidia-uvm", "c", 508, 0))
    assert dict(grant.env) == {"NVIDIA_VISIBLE_DEVICES": f"{gpu.uuid},{other.uuid}"}


def test_a_gpu_node_takes_the_numbers_the_host_gives_it(tmp_path):
    gpu = DGX.gpus[0]
    _mknod(tmp_path, f"nvidia{gpu.minor}", 1, 3)  # as the NRI e2e test fakes one
    [node] = DeviceGranter(DGX, tmp_path).grant({"nvidia.com/gpu": (gpu.uuid,)}).nodes
    assert (node.path, node.major, node.minor) == (f"/dev/nvidia{gpu.minor}", 1, 3)


def test_a_missing_minor_comes_from_the_driver(tmp_path):
    gpu = DGX.gpus[0]  # bus 1b, as in the fixture file, which says minor 2
    topology = replace(DGX, gpus=(replace(gpu, minor=None), *DGX.gpus[1:]))
    dev, root = tmp_path / "dev", tmp_path / "root"
    dev.mkdir()
    granter = DeviceGranter(topology, dev, root)
    with pytest.raises(GrantError, match=f"GPU {gpu.uuid} \\({gpu.pci_address}\\): its "
                                         "/dev/nvidia<minor> is known neither"):
        granter.grant({"nvidia.com/gpu": (gpu.uuid,)})
    folder = root / GPUS_DIR / gpu.pci_address
    folder.mkdir(parents=True)
    (folder / "information").write_text(FIXTURE.read_text())
    [node] = granter.grant({"nvidia.com/gpu": (gpu.uuid,)}).nodes
    assert node == GrantedNode("/dev/nvidia2", "c", NVIDIA_MAJOR, 2)


def test_an_unknown_gpu_is_an_error(tmp_path):
    with pytest.raises(GrantError, match="GPU-nope is not a GPU of this machine"):
        DeviceGranter(DGX, tmp_path).grant({"nvidia.com/gpu": ("GPU-nope",)})


def _uverbs(root: Path, index: int, ibdev: str) -> None:
    folder = root / UVERBS_CLASS / f"uverbs{index}"
    folder.mkdir(parents=True)
    (folder / "ibdev").write_text(ibdev + "\n")


def test_nics_get_their_rdma_nodes_where_present(tmp_path):
    dev, root = tmp_path / "dev", tmp_path / "root"
    nic, other = DGX.nics[0], DGX.nics[1]
    [rdma], [other_rdma] = nic.rdma, other.rdma
    _uverbs(root, 0, other_rdma)
    _uverbs(root, 1, rdma)
    _mknod(dev, "infiniband/uverbs0", 231, 192)
    _mknod(dev, "infiniband/uverbs1", 231, 193)
    granter = DeviceGranter(DGX, dev, root)
    assert granter.grant({CX7: (nic.pci_address,)}).nodes == (
        GrantedNode("/dev/infiniband/uverbs1", "c", 231, 193),)
    _mknod(dev, "infiniband/rdma_cm", 10, 58)
    grant = granter.grant({CX7: (nic.pci_address,)})
    assert grant.nodes == (GrantedNode("/dev/infiniband/uverbs1", "c", 231, 193),
                           GrantedNode("/dev/infiniband/rdma_cm", "c", 10, 58))
    assert dict(grant.env) == {}
    # Without RDMA on the host a NIC has no node to give (its netdev is the CNI's business).
    assert not DeviceGranter(DGX, tmp_path / "empty", tmp_path / "empty").grant(
        {CX7: (nic.pci_address,)})


def test_no_devices_no_grant(tmp_path):
    assert not DeviceGranter(DGX, tmp_path).grant({})
