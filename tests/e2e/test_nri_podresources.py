"""``nri-numa run --pod-resources-socket`` on real containerd 1.7.24 and 2.1.9 with runc, the
kubelet played by the fake PodResources server (``python -m nri_numa.podresources.fake_server``).

This machine has CPUs 0-1 on one NUMA node, so the agent is given a topology file that splits
them: node 0 holds CPU 1 and a GPU, node 1 holds CPU 0 (the reserved CPU) and another GPU. Every
cpuset the agent can write then exists on the real machine (CPU 1, memory node 0). The runtime's
spec names no GPU; only the kubelet's answer says where each container's GPU is:

* GPU on node 0 (found through its UUID, the kubelet gave no topology) → CPU 1;
* GPU on node 1 (the kubelet's topology) → no free CPU there, refused under single-numa-node.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (EXCLUSIVE, GUARANTEED_1, REPO, agent_on, spec_cpus,
                                 start_and_connect)

pytestmark = pytest.mark.e2e
GIB = 1 << 30
NEAR, FAR = "GPU-e2e-node0", "GPU-e2e-node1"
STATE = f"""
pods:
  - name: near
    containers: [{{name: work, devices: [{{resource: nvidia.com/gpu, ids: [{NEAR}]}}]}}]
  - name: far
    containers: [{{name: work, devices: [{{resource: nvidia.com/gpu, ids: [{FAR}], numa: [1]}}]}}]
"""


def split_machine() -> Topology:
    cpus = (Cpu(id=0, numa=1, core=0, socket=1), Cpu(id=1, numa=0, core=1, socket=0))
    nodes = (NumaNode(id=0, cpus=frozenset({1}), memory_bytes=GIB, distances={0: 10, 1: 21}),
             NumaNode(id=1, cpus=frozenset({0}), memory_bytes=GIB, distances={0: 21, 1: 10}))
    pci = (PciDevice("0000:17:00.0", 0, 0x030200, 0x10DE, 0x2330),
           PciDevice("0000:81:00.0", 1, 0x030200, 0x10DE, 0x2330))
    gpus = (Gpu(0, NEAR, "0000:17:00.0", 0, 0), Gpu(1, FAR, "0000:81:00.0", 1, 1))
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=pci, gpus=gpus)


@pytest.fixture
def kubelet_socket(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "pods.yaml").write_text(STATE)
    socket = tmp_path / "kubelet.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "nri_numa.podresources.fake_server", "--socket", str(socket),
         "--state", str(tmp_path / "pods.yaml")], cwd=REPO, stderr=subprocess.PIPE)
    try:
        assert b"serving" in server.stderr.readline()
        yield socket
    finally:
        server.terminate()
        server.wait(10)


def test_the_kubelets_gpus_decide_the_node(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        kubelet_socket: Path, tmp_path: Path) -> None:
    (tmp_path / "node.json").write_text(split_machine().to_json())
    with agent_on(containerd.paths.nri_socket, tmp_path) as agent:
        agent.extra_args = ("--topology", str(tmp_path / "node.json"),
                            "--pod-resources-socket", str(kubelet_socket), "--log-level", "debug")
        start_and_connect(containerd, agent)

        far = Pod("far", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(far)
        with pytest.raises(grpc.RpcError) as refused:
            cri_client.create_container(sandbox, far.container_config("work", busybox_image.ref))
        assert "nri-numa: TopologyAffinityError" in refused.value.details()

        near = Pod("near", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(near)
        container = cri_client.create_container(sandbox, near.container_config("work",
                                                                               busybox_image.ref))
        assert spec_cpus(cri_client, container) == EXCLUSIVE
        cri_client.start_container(container)
        log = agent.log_text()
        assert f"using the kubelet's PodResources API at {kubelet_socket}" in log
        assert "placed pod default/near container work: policy single-numa-node, hint NUMA 0 " \
               "(preferred), cpus 1 (exclusive), mems unchanged" in log
        assert "refused pod default/far container work: TopologyAffinityError" in log
