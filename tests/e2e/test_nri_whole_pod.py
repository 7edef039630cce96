"""The whole pod at its first container on real containerd 1.7 and 2.1: the sandbox's resources
the kubelet sets (CRI ``LinuxPodSandboxConfig.resources``) reach nri-numa through NRI
(``PodSandbox.linux.pod_resources``), and under pod scope the first container's merge then
counts the whole pod, as the kubelet's does.

The agent runs on a topology file that splits this 2-CPU machine: the reserved CPU 0 on NUMA
node 0, CPU 1 on node 1. The pod is Guaranteed: a first container of 100m (shared CPUs, no
hint of its own) and a second of 1 CPU. The kubelet's pod scope merges the pod's one exclusive
CPU, which only node 1 has: hint NUMA 1 for both containers. Knowing only the first container,
nri-numa merged no CPU at all."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, Resources
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (CONFIG, EXCLUSIVE, GUARANTEED_1, MiB, agent_on, spec_cpus,
                                 start_and_connect)

pytestmark = pytest.mark.e2e

SMALL = Resources(cpu_request_m=100, cpu_limit_m=100, memory_request=64 * MiB,
                  memory_limit=64 * MiB)
GIB = 1 << 30


def split_machine() -> Topology:
    """CPU 0 (reserved) on NUMA node 0, CPU 1 on node 1; mems are never written (no Memory
    Manager), so the kernel's single memory node is never asked for node 1."""
    cpus = (Cpu(id=0, numa=0, core=0, socket=0), Cpu(id=1, numa=1, core=1, socket=1))
    nodes = (NumaNode(id=0, cpus=frozenset({0}), memory_bytes=GIB, distances={0: 10, 1: 21}),
             NumaNode(id=1, cpus=frozenset({1}), memory_bytes=GIB, distances={0: 21, 1: 10}))
    return Topology(cpus=cpus, numa_nodes=nodes)


@dataclass(frozen=True)
class PodOfAnOldKubelet(Pod):
    """As a kubelet before 1.23 describes the sandbox: no LinuxPodSandboxConfig.resources."""

    def sandbox_config(self) -> cri.PodSandboxConfig:
        config = super().sandbox_config()
        config.linux.ClearField("resources")
        return config


@pytest.mark.parametrize("kind", [Pod, PodOfAnOldKubelet], ids=["sandbox-resources", "none"])
def test_the_sandbox_resources_put_the_pod_on_the_node_of_its_exclusive_cpu(
        kind: type[Pod], containerd: ContainerdDaemon, cri_client: CriClient,
        busybox_image: BuiltImage, tmp_path) -> None:
    with agent_on(containerd.paths.nri_socket, tmp_path, topology=split_machine()) as agent:
        agent.config_file.write_text("".join(
            f"{k}: {json.dumps(v)}\n"
            for k, v in {**CONFIG, "topologyManagerScope": "pod"}.items()))
        start_and_connect(containerd, agent)
        pod = kind("two", (SMALL, GUARANTEED_1))
        sandbox = cri_client.run_pod(pod)
        cri_client.create_container(sandbox, pod.container_config("small", busybox_image.ref))
        large = cri_client.create_container(
            sandbox, pod.container_config("large", busybox_image.ref, index=1))
        assert spec_cpus(cri_client, large) == EXCLUSIVE
        log = agent.log_text()
        if kind is Pod:
            assert ("placed pod default/two container small: policy single-numa-node, hint NUMA "
                    "1 (preferred), cpus 0-1 (shared), mems unchanged, pod known from the "
                    "sandbox's resources") in log
        else:  # today's behaviour, said as such
            line = next(ln for ln in log.splitlines() if "container small:" in ln)
            assert "hint NUMA 1 " not in line
            assert line.endswith("pod known from the containers created so far")
