"""CDI in use: names in a container's cdi.k8s.io annotations become NUMA hints (GPUs by UUID or
index, other devices through the nodes a real spec file gives them and a sysfs-style tree), and
GPUs given by CDI name instead of device nodes, by mode and by the runtime that configured us."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from nri_numa.engine.decision import Placement
from nri_numa.nri import translate
from nri_numa.runtime import (DeviceGranter, DeviceLocator, GrantedNode, GrantError,
                              RuntimeContainer, RuntimePod)
from nri_numa.runtime.cdi import CdiRegistry
from nri_numa.runtime.device_grant import NVIDIA_MAJOR, UVERBS_CLASS
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice
from nri_numa.topology.synthetic import preset_topology

FPGA_PCI = "0000:c1:00.0"
GPU0 = Gpu(index=0, uuid="GPU-aaaa", pci_address="0000:17:00.0", numa_node=0, minor=3)
GPU1 = Gpu(index=1, uuid="GPU-bbbb", pci_address="0000:b1:00.0", numa_node=1, minor=0)


def _machine() -> Topology:
    cpus = tuple(Cpu(id=i, numa=i // 2, core=i, socket=0) for i in range(4))
    nodes = tuple(NumaNode(id=n, cpus=frozenset({2 * n, 2 * n + 1}), memory_bytes=1 << 30)
                  for n in range(2))
    pci = tuple(PciDevice(address=a, numa_node=n, class_code=0x120000, vendor=0x1172, device=1)
                for a, n in ((FPGA_PCI, 1), (GPU0.pci_address, 0), (GPU1.pci_address, 1)))
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=pci, gpus=(GPU0, GPU1))


def _spec(folder: Path, name: str, kind: str, devices: list[dict], **extra: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": kind, "devices": devices,
                                **extra}))
    return path


def _device(name: str, *nodes: dict) -> dict:
    return {"name": name, "containerEdits": {"deviceNodes": list(nodes)}}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """sysfs: char 240:0 sits under the FPGA's PCI function."""
    target = tmp_path / "sys" / "devices" / "pci0000:c0" / FPGA_PCI / "fpga" / "fpga0"
    target.mkdir(parents=True)
    link = tmp_path / "sys" / "dev" / "char" / "240:0"
    link.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(target, link.parent), link)
    return tmp_path


def _container(**annotations: str) -> RuntimeContainer:
    return RuntimeContainer(id="c1", name="work", pod=RuntimePod(id="p"),
                            annotations=annotations)


# --- hints ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value, nodes", [
    ("nvidia.com/gpu=GPU-bbbb", {1}),
    ("nvidia.com/gpu=0", {0}),
    ("nvidia.com/gpu=0,nvidia.com/gpu=GPU-bbbb", {0, 1}),
    ("k8s.device-plugin.nvidia.com/gpu=GPU-aaaa", {0}),  # a UUID, whatever the kind
    ("k8s.device-plugin.nvidia.com/gpu=1", None),  # an index means NVML's only in nvidia.com/gpu
    ("nvidia.com/gpu=all", None),  # every GPU: no hint
    ("nvidia.com/gpu=MIG-1234", None),  # MIG UUIDs are not mapped by name
    ("nvidia.com/gpu=1:0", {1}),  # a MIG instance by index: its GPU's node
    ("nvidia.com/gpu=1:x", None),
    ("k8s.device-plugin.nvidia.com/gpu=1:0", None),
    ("nvidia.com/gpu=7", None),
])
def test_gpus_named_in_cdi_annotations(root, value, nodes):
    locator = DeviceLocator(_machine(), root, CdiRegistry([root / "cdi"]))
    hints = locator.numa_hints(_container(**{"cdi.k8s.io/nvidia-device-plugin_x": value}))
    assert hints == ({} if nodes is None else {"nvidia.com/gpu": nodes})


def test_other_names_follow_the_nodes_their_spec_gives(root):
    host = root / "fpga0"
    os.mknod(host, 0o600 | stat.S_IFCHR, os.makedev(240, 0))
    _spec(root / "cdi", "fpga.json", "vendor.com/fpga", [
        _device("card0", {"path": "/dev/fpga0", "type": "c", "major": 240, "minor": 0}),
        _device("card1", {"path": "/dev/fpga1", "hostPath": str(host)}),  # numbers from host
        _device("virtual", {"path": "/dev/fpga-virt", "type": "c", "major": 10, "minor": 1})])
    locator = DeviceLocator(_machine(), root, CdiRegistry([root / "cdi"]))
    assert locator.numa_hints(_container(**{"cdi.k8s.io/fpga": "vendor.com/fpga=card0"})) == {
        "/dev/fpga0": {1}}
    assert locator.numa_hints(_container(**{"cdi.k8s.io/fpga": "vendor.com/fpga=card1"})) == {
        "/dev/fpga1": {1}}
    for name in ("virtual", "card9"):  # no PCI parent; no such device
        assert locator.numa_hints(_container(**{"cdi.k8s.io/f": f"vendor.com/fpga={name}"})) == {}


def test_a_gpu_under_a_name_of_its_own_is_found_by_its_node(root):
    _spec(root / "cdi", "gpus.json", "example.com/gpu",
          [_device("big", {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0})],
          containerEdits={"deviceNodes": [{"path": "/dev/nvidiactl", "type": "c",
                                           "major": 195, "minor": 255}]})
    locator = DeviceLocator(_machine(), root, CdiRegistry([root / "cdi"]))
    assert locator.numa_hints(_container(**{"cdi.k8s.io/g": "example.com/gpu=big"})) == {
        "nvidia.com/gpu": {1}}


def test_bad_annotations_and_broken_specs_never_fail_a_container(root, caplog):
    (root / "cdi").mkdir()
    (root / "cdi" / "broken.yaml").write_text("devices: [")
    locator = DeviceLocator(_machine(), root, CdiRegistry([root / "cdi"]))
    container = _container(**{"cdi.k8s.io/a": "nonsense,nvidia.com/gpu=GPU-aaaa",
                              "cdi.k8s.io/b": "vendor.com/fpga=card0"})
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert locator.numa_hints(container) == {"nvidia.com/gpu": {0}}
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("container work: annotation cdi.k8s.io/a: 'nonsense' is not a CDI device "
                       "name: no '=' before the device (vendor.com/class=name); not used") == 1
    assert len([m for m in lines if "broken.yaml: not YAML" in m]) == 1


# --- GPUs given by CDI name ----------------------------------------------------------------

DGX = preset_topology("dgx-h100")
GPU_A, GPU_B = DGX.gpus[0], DGX.gpus[1]
CX7 = "pci/15b3:1021"


def _nvidia_spec(folder: Path, *gpus: Gpu) -> None:
    _spec(folder, "nvidia.yaml", "nvidia.com/gpu",
          [_device(str(g.index), {"path": f"/dev/nvidia{g.minor}"}) for g in gpus]
          + [_device(g.uuid, {"path": f"/dev/nvidia{g.minor}"}) for g in gpus])


def _granter(tmp_path: Path, injection: str) -> DeviceGranter:
    return DeviceGranter(DGX, tmp_path / "dev", tmp_path, cdi=CdiRegistry([tmp_path / "cdi"]),
                         injection=injection)


def test_auto_gives_cdi_names_once_the_runtime_is_known_to_apply_them(tmp_path):
    _nvidia_spec(tmp_path / "cdi", GPU_A, GPU_B)
    granter = _granter(tmp_path, "auto")
    devices = {"nvidia.com/gpu": (GPU_A.uuid, GPU_B.uuid)}
    before = granter.grant(devices)  # not configured yet: nodes
    assert before.nodes and not before.cdi_devices and "NVIDIA_VISIBLE_DEVICES" in before.env
    line = granter.use_runtime("containerd", "2.1.9+unknown")
    assert line.startswith("device injection auto: containerd 2.1.9+unknown applies CDI")
    grant = granter.grant(devices)
    assert grant.cdi_devices == (f"nvidia.com/gpu={GPU_A.uuid}", f"nvidia.com/gpu={GPU_B.uuid}")
    assert grant.nodes == () and dict(grant.env) == {}
    granter.use_runtime("containerd", "1.7.24~ds1")
    assert not granter.grant(devices).cdi_devices


def test_auto_gives_nodes_to_a_container_whose_gpus_a_spec_does_not_all_name(tmp_path):
    _nvidia_spec(tmp_path / "cdi", GPU_A)
    granter = _granter(tmp_path, "auto")
    granter.use_runtime("containerd", "2.1.9")
    grant = granter.grant({"nvidia.com/gpu": (GPU_A.uuid, GPU_B.uuid)})
    assert not grant.cdi_devices
    assert {n.path for n in grant.nodes} >= {f"/dev/nvidia{GPU_A.minor}",
                                              f"/dev/nvidia{GPU_B.minor}"}
    assert dict(grant.env) == {"NVIDIA_VISIBLE_DEVICES": f"{GPU_A.uuid},{GPU_B.uuid}"}


def test_cdi_is_used_whatever_the_runtime_and_refuses_a_gpu_no_spec_names(tmp_path):
    _nvidia_spec(tmp_path / "cdi", GPU_A)
    granter = _granter(tmp_path, "cdi")
    assert granter.use_runtime("containerd", "1.7.24").startswith("device injection cdi")
    assert granter.grant({"nvidia.com/gpu": (GPU_A.uuid,)}).cdi_devices == (
        f"nvidia.com/gpu={GPU_A.uuid}",)
    with pytest.raises(GrantError, match=f"GPU {GPU_B.uuid} .*: no CDI device in "
                                         f"{tmp_path / 'cdi'} names it"):
        granter.grant({"nvidia.com/gpu": (GPU_A.uuid, GPU_B.uuid)})
    with pytest.raises(GrantError, match="GPU-nope is not a GPU of this machine"):
        granter.grant({"nvidia.com/gpu": ("GPU-nope",)})


def test_nodes_ignores_cdi_and_nics_always_get_nodes(tmp_path):
    _nvidia_spec(tmp_path / "cdi", GPU_A)
    nodes = _granter(tmp_path, "nodes")
    nodes.use_runtime("containerd", "2.1.9")
    assert not nodes.grant({"nvidia.com/gpu": (GPU_A.uuid,)}).cdi_devices
    nic = DGX.nics[0]
    folder = tmp_path / UVERBS_CLASS / "uverbs0"
    folder.mkdir(parents=True)
    (folder / "ibdev").write_text(nic.rdma[0] + "\n")
    (tmp_path / "dev" / "infiniband").mkdir(parents=True)
    os.mknod(tmp_path / "dev" / "infiniband" / "uverbs0", 0o666 | stat.S_IFCHR,
             os.makedev(231, 192))
    cdi = _granter(tmp_path, "cdi")
    grant = cdi.grant({"nvidia.com/gpu": (GPU_A.uuid,), CX7: (nic.pci_address,)})
    assert grant.cdi_devices == (f"nvidia.com/gpu={GPU_A.uuid}",)
    assert grant.nodes == (GrantedNode("/dev/infiniband/uverbs0", "c", 231, 192),)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="'magic' is not one of nodes, cdi, auto"):
        DeviceGranter(DGX, injection="magic")


def test_the_adjustment_carries_cdi_names_and_no_nodes(tmp_path):
    _nvidia_spec(tmp_path / "cdi", GPU_A)
    grant = _granter(tmp_path, "cdi").grant({"nvidia.com/gpu": (GPU_A.uuid,)})
    placement = Placement("app", frozenset({4}), True, frozenset({0}),
                          {"nvidia.com/gpu": (GPU_A.uuid,)})
    adjust = translate.adjustment(placement, grant)
    assert [d.name for d in adjust.CDI_devices] == [f"nvidia.com/gpu={GPU_A.uuid}"]
    assert not adjust.linux.devices and not adjust.linux.resources.devices and not adjust.env
    assert adjust.linux.resources.cpu.cpus == "4"
    # On the wire: field 8 of ContainerAdjustment, as NRI v0.7+ reads it.
    assert bytes.fromhex("42") + bytes([len(adjust.CDI_devices[0].SerializeToString())]) in (
        adjust.SerializeToString())


def test_a_node_grant_is_unchanged_by_cdi(tmp_path):
    granter = _granter(tmp_path, "auto")
    granter.use_runtime("containerd", "2.1.9")  # no spec at all: nodes, as before
    [node, *_] = granter.grant({"nvidia.com/gpu": (GPU_A.uuid,)}).nodes
    assert node == GrantedNode(f"/dev/nvidia{GPU_A.minor}", "c", NVIDIA_MAJOR, GPU_A.minor)

