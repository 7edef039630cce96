"""Devices through the NRI plugin on real containerd 1.7.24 and 2.1.9 with runc.

The plugin runs on a synthetic topology (``nri-numa run --topology``) laid over this 2-CPU VM:
node 0 holds CPU 1 and node 1 holds CPU 0 (numbered so that the exclusive CPU, 1, sits on node
0, the one node the real kernel has). ``reservedSystemCPUs: "0"`` leaves CPU 1 as the one exclusive CPU, so
landing there proves nothing by itself; what proves the device's pull is the contrast under
single-numa-node: the device on CPU 1's node is admitted there, the same device on the other
node is refused with TopologyAffinityError.

* **A device given by another party**: a real block device of this VM with a PCI parent
  (``/sys/dev/block/MAJ:MIN`` → ``0000:00:02.0``), put in the container's CRI
  ``ContainerConfig.devices``. containerd hands it to the plugin as a ``LinuxDevice``; the
  plugin follows sysfs to the PCI function and the topology to its node.
* **A GPU asked for by annotation** (``numa.nri.io/devices.<container>`` on the pod): the
  topology has one fake GPU; its ``/dev/nvidia<minor>`` exists only in a temporary dev root
  (``nri-numa run --dev-root``), mknod'ed with /dev/null's numbers (1:3) so that runc can create
  it and the container starts. What this proves: the annotation reaches the engine, the GPU is
  allocated, and its node, allow rule and ``NVIDIA_VISIBLE_DEVICES`` reach the OCI spec and the
  running container. What it does not: anything about a real NVIDIA driver.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, Resources
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (GUARANTEED_1, Agent, agent_on, cgroup_cpus, spec_cpus,
                                 start_and_connect)

pytestmark = pytest.mark.e2e
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
GPU_UUID = "GPU-00000000-e2e0-0000-0000-000000000001"
GPU_PCI = "0000:00:1f.7"  # not on this VM: the GPU exists only in the topology
GPU_MINOR = 7
EXCLUSIVE_CPU_NODE, OTHER_NODE = 0, 1


@dataclass(frozen=True)
class HostDevice:
    path: str  # /dev/vda
    major: int
    minor: int
    pci: str  # the PCI function sysfs puts above it


def host_block_device_with_pci() -> HostDevice:
    """A block device of this machine under a PCI function; fails (never skips) without one."""
    by_number = {}
    for name in sorted(os.listdir("/dev")):
        try:
            st = os.stat(f"/dev/{name}")
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):
            by_number.setdefault((os.major(st.st_rdev), os.minor(st.st_rdev)), f"/dev/{name}")
    for number in sorted(os.listdir("/sys/dev/block")):
        major, _, minor = number.partition(":")
        target = os.path.realpath(f"/sys/dev/block/{number}")
        pcis = [p for p in Path(target).parts if PCI_ADDRESS.fullmatch(p)]
        path = by_number.get((int(major), int(minor)))
        if pcis and path:
            return HostDevice(path, int(major), int(minor), pcis[-1])
    raise AssertionError("no block device under a PCI function on this machine "
                         "(/sys/dev/block/*): the test needs one")


def vm_on_two_nodes(gpu_node: int, *pci: PciDevice) -> Topology:
    """This VM's two CPUs on two synthetic nodes (CPU 1, the exclusive one, on node 0), the
    given PCI functions, and the fake GPU on ``gpu_node``."""
    cpus = (Cpu(0, OTHER_NODE, core=0, socket=0), Cpu(1, EXCLUSIVE_CPU_NODE, core=1, socket=0))
    nodes = tuple(NumaNode(n, frozenset({1 - n}), 1 << 30, distances={n: 10, 1 - n: 21})
                  for n in (0, 1))
    gpu_pci = PciDevice(GPU_PCI, gpu_node, 0x030200, 0x10DE, 0x2330)
    gpu = Gpu(0, GPU_UUID, GPU_PCI, gpu_node, minor=GPU_MINOR)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=(*pci, gpu_pci), gpus=(gpu,))


def overlay_topology(device_pci: str, device_node: int) -> Topology:
    """The real PCI function on ``device_node``, the fake GPU on the exclusive CPU's node."""
    return vm_on_two_nodes(EXCLUSIVE_CPU_NODE,
                           PciDevice(device_pci, device_node, 0x010000, 0x1AF4, 0x1001))


@contextmanager
def overlay_agent(containerd: ContainerdDaemon, tmp_path: Path, topology: Topology,
                  dev_root: Path) -> Iterator[Agent]:
    with agent_on(containerd.paths.nri_socket, tmp_path, topology,
                  ("--dev-root", str(dev_root))) as agent:
        start_and_connect(containerd, agent)
        yield agent


@dataclass(frozen=True)
class AnnotatedPod(Pod):
    """A pod whose sandbox carries annotations of its own (the harness's carries one)."""

    annotations: dict[str, str] = field(default_factory=dict)

    def sandbox_config(self) -> cri.PodSandboxConfig:
        config = super().sandbox_config()
        config.annotations.update(self.annotations)
        return config


def with_device(config: cri.ContainerConfig, device: HostDevice) -> cri.ContainerConfig:
    config.devices.add(container_path="/dev/nri-numa-disk", host_path=device.path,
                       permissions="r")
    return config


def spec_of(client: CriClient, container_id: str) -> dict:
    return client.container_info(container_id)["runtimeSpec"]


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="dev-", dir=tmp_path))
    os.mknod(root / f"nvidia{GPU_MINOR}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return root


@pytest.mark.parametrize("device_node", [EXCLUSIVE_CPU_NODE, OTHER_NODE])
def test_cpus_follow_a_device_given_by_another_party(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, tmp_path: Path, dev_root: Path, device_node: int) -> None:
    device = host_block_device_with_pci()
    with overlay_agent(containerd, tmp_path, overlay_topology(device.pci, device_node),
                       dev_root):
        pod = Pod("disk", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(pod)
        config = with_device(pod.container_config("work", busybox_image.ref), device)
        if device_node != EXCLUSIVE_CPU_NODE:
            with pytest.raises(grpc.RpcError) as refused:
                cri_client.create_container(sandbox, config)
            assert "TopologyAffinityError" in refused.value.details()
            return
        container = cri_client.create_container(sandbox, config)
        spec = spec_of(cri_client, container)
        assert {(d["path"], d["major"], d["minor"]) for d in spec["linux"]["devices"]} >= {
            ("/dev/nri-numa-disk", device.major, device.minor)}
        assert spec_cpus(cri_client, container) == {1}
        assert not spec["linux"]["resources"]["cpu"].get("mems")  # no Memory Manager: left alone
        cri_client.start_container(container)
        assert cgroup_cpus(cri_client, cgroup_layout, container) == {1}


def test_a_gpu_asked_for_by_annotation_is_given(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, tmp_path: Path, dev_root: Path) -> None:
    device = host_block_device_with_pci()
    with overlay_agent(containerd, tmp_path, overlay_topology(device.pci, OTHER_NODE),
                       dev_root):
        pod = AnnotatedPod("gpu", (GUARANTEED_1,),
                           annotations={"numa.nri.io/devices.work": "nvidia.com/gpu=1"})
        sandbox = cri_client.run_pod(pod)
        container = cri_client.create_container(
            sandbox, pod.container_config("work", busybox_image.ref))
        spec = spec_of(cri_client, container)
        node = f"/dev/nvidia{GPU_MINOR}"
        [given] = [d for d in spec["linux"]["devices"] if d["path"] == node]
        assert (given["type"], given["major"], given["minor"]) == ("c", 1, 3)
        # One allow rule: NRI's spec generator derives it from the device node ("rw" for a
        # char node of mode 0666); the rule the plugin also sends in linux.resources.devices is
        # not applied by containerd (docs/devices.md).
        [rule] = [r for r in spec["linux"]["resources"]["devices"]
                  if r.get("allow") and (r.get("major"), r.get("minor")) == (1, 3)]
        assert rule["type"] == "c" and "rw" in rule["access"]
        assert f"NVIDIA_VISIBLE_DEVICES={GPU_UUID}" in spec["process"]["env"]
        assert spec_cpus(cri_client, container) == {1}
        cri_client.start_container(container)
        assert cgroup_cpus(cri_client, cgroup_layout, container) == {1}
        seen = cri_client.exec_sync(container, ["sh", "-c", f"ls -l {node}; echo x > {node}; "
                                                            "echo $NVIDIA_VISIBLE_DEVICES"])
        assert seen.exit_code == 0, seen.stderr
        assert re.search(r"^c.* 1, +3 .*/dev/nvidia7$", seen.stdout, re.M), seen.stdout
        assert seen.stdout.strip().endswith(GPU_UUID)

        # A second container (BestEffort: no CPU to compete for) asking for a GPU finds none
        # left: refused, naming the resource.
        other = AnnotatedPod("gpu2", (Resources(),),
                             annotations={"numa.nri.io/devices.work": "nvidia.com/gpu=1"})
        other_sandbox = cri_client.run_pod(other)
        with pytest.raises(grpc.RpcError) as refused:
            cri_client.create_container(other_sandbox,
                                        other.container_config("work", busybox_image.ref))
        assert "nvidia.com/gpu" in refused.value.details()


def test_gpus_are_held_again_after_the_checkpoint_is_lost(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        tmp_path: Path, dev_root: Path) -> None:
    """Two fake GPUs. Pod "first" gets one and goes; "second" holds the other. The agent is
    killed and its checkpoint deleted; Synchronize must read second's GPU back from the running
    container (its NVIDIA_VISIBLE_DEVICES, as containerd reports it), so that the next pod gets
    the GPU first had, not second's, which the engine would otherwise pick first again."""
    os.mknod(dev_root / f"nvidia{GPU_MINOR + 1}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    one = vm_on_two_nodes(EXCLUSIVE_CPU_NODE)
    gpu_b = Gpu(1, GPU_UUID[:-1] + "2", "0000:00:1f.6", EXCLUSIVE_CPU_NODE, minor=GPU_MINOR + 1)
    two = Topology(cpus=one.cpus, numa_nodes=one.numa_nodes, gpus=(*one.gpus, gpu_b),
                   pci_devices=(*one.pci_devices,
                                PciDevice(gpu_b.pci_address, EXCLUSIVE_CPU_NODE, 0x030200,
                                          0x10DE, 0x2330)))

    def gpu_pod(name: str) -> tuple[str, str]:
        pod = AnnotatedPod(name, (Resources(),),
                           annotations={"numa.nri.io/devices.work": "nvidia.com/gpu=1"})
        sandbox = cri_client.run_pod(pod)
        container = cri_client.create_container(
            sandbox, pod.container_config("work", busybox_image.ref))
        cri_client.start_container(container)
        env = spec_of(cri_client, container)["process"]["env"]
        [visible] = [e.partition("=")[2] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        return sandbox, visible

    with overlay_agent(containerd, tmp_path, two, dev_root) as agent:
        first, freed = gpu_pod("first")
        second, kept = gpu_pod("second")
        assert {freed, kept} == {GPU_UUID, gpu_b.uuid}
        cri_client.stop_pod(first)
        cri_client.remove_pod(first)
        agent.kill()
        (agent.state_dir / "checkpoint.json").unlink()
        start_and_connect(containerd, agent)
        agent.wait_log("synchronized:", count=2)
        _, gpu = gpu_pod("third")
        assert gpu == freed, agent.log_text()
