"""A device from a DRA driver on real containerd 2.1.9: the kubelet hands a prepared claim to the
runtime as CDI names in CRI's ``ContainerConfig.CDI_devices``; containerd applies the CDI spec
(device nodes, environment) before NRI's CreateContainer, so nri-numa sees the device the
runtime injected and puts the container's CPUs on that device's NUMA node, as it does for a
device plugin's (docs/devices.md, "Beside DRA drivers").

The CDI spec, as a DRA GPU driver writes one (kind ``gpu.example.com/gpu``, devices named as a
ResourceSlice names them), has two fake GPUs: ``gpu-0`` is ``/dev/nvidia6`` (195:6) on the node
without a free CPU, ``gpu-1`` is ``/dev/nvidia7`` (195:7) on the node of CPU 1 (the synthetic
topology of tests/e2e/test_nri_devices.py, with a second GPU). The nodes carry NVIDIA's major
and no host path: runc makes them in the container, which never opens them."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.runtimes import Runtimes
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import EXCLUSIVE, GUARANTEED_1, agent_on, spec_cpus, start_and_connect
from tests.e2e.test_nri_cdi import containerd_with_cdi
from tests.e2e.test_nri_devices import EXCLUSIVE_CPU_NODE, OTHER_NODE

pytestmark = pytest.mark.e2e
VERSION = "2.1.9"  # CRI's CDI_devices: applied by containerd 2.x
KIND = "gpu.example.com/gpu"
GPUS = {"gpu-0": (6, OTHER_NODE, "GPU-00000000-e2e0-0000-0000-0000000000a6", "0000:00:1e.6"),
        "gpu-1": (7, EXCLUSIVE_CPU_NODE, "GPU-00000000-e2e0-0000-0000-0000000000a7",
                  "0000:00:1e.7")}


def machine() -> Topology:
    """This VM's two CPUs on two synthetic nodes (CPU 1 on EXCLUSIVE_CPU_NODE) and two GPUs."""
    cpus = (Cpu(0, OTHER_NODE, core=0, socket=0), Cpu(1, EXCLUSIVE_CPU_NODE, core=1, socket=0))
    nodes = tuple(NumaNode(n, frozenset({1 - n}), 1 << 30, distances={n: 10, 1 - n: 21})
                  for n in (0, 1))
    pci = tuple(PciDevice(address, node, 0x030200, 0x10DE, 0x2330)
                for _, node, _, address in GPUS.values())
    gpus = tuple(Gpu(i, uuid, address, node, minor=minor)
                 for i, (minor, node, uuid, address) in enumerate(GPUS.values()))
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=pci, gpus=gpus)


def write_driver_spec(base: Path) -> None:
    (base / "cdi").mkdir()
    (base / "cdi" / "dra-gpus.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": KIND,
        "devices": [{"name": name, "containerEdits": {
            "deviceNodes": [{"path": f"/dev/nvidia{minor}", "type": "c", "major": 195,
                             "minor": minor}],
            "env": [f"FAKE_DRA_GPU={name}"]}} for name, (minor, *_) in GPUS.items()]}))


@pytest.fixture(scope="module")
def containerd(runtimes: Runtimes, busybox_image: BuiltImage, step_times: StepTimes,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdDaemon]:
    """containerd 2.1.9 with CDI on and the DRA driver's spec in a spec dir of its own."""
    with containerd_with_cdi(VERSION, runtimes, busybox_image, step_times, tmp_path_factory,
                             write_driver_spec) as made:
        yield made


def with_claim(pod: Pod, image: str, device: str):
    config = pod.container_config("work", image)
    config.CDI_devices.add(name=f"{KIND}={device}")
    return config


def test_the_cpus_follow_the_device_a_dra_claim_brought(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        tmp_path: Path) -> None:
    dev = Path(tempfile.mkdtemp(prefix="dev-", dir=tmp_path))  # the plugin hands out nothing
    with agent_on(containerd.paths.nri_socket, tmp_path, machine(),
                  ("--dev-root", str(dev), "--cdi-spec-dirs",
                   ",".join(containerd.cdi_spec_dirs or ()))) as agent:
        start_and_connect(containerd, agent)
        near = Pod("near", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(near)
        container = cri_client.create_container(
            sandbox, with_claim(near, busybox_image.ref, "gpu-1"))
        assert spec_cpus(cri_client, container) == EXCLUSIVE
        spec = cri_client.container_info(container)["runtimeSpec"]
        assert "FAKE_DRA_GPU=gpu-1" in spec["process"]["env"]  # containerd applied the claim
        assert any(d["path"] == "/dev/nvidia7" for d in spec["linux"]["devices"])

        far = Pod("far", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(far)
        with pytest.raises(grpc.RpcError) as refused:
            cri_client.create_container(sandbox, with_claim(far, busybox_image.ref, "gpu-0"))
        assert "nri-numa: TopologyAffinityError" in refused.value.details()
        log = agent.log_text()
        assert (f"placed pod default/near container work: policy single-numa-node, hint NUMA "
                f"{EXCLUSIVE_CPU_NODE} (preferred), cpus 1 (exclusive)") in log
