"""The whole pod at its first container under the real kubelet v1.20.2, through the API server
(nri_numa.nri.whole_pod; docs/kubernetes.md): the lab's agent has a kubeconfig, so its export
process watches the node's pods, and under pod scope the first container's merge counts the
whole pod, as the kubelet's pod scope does. A 1.20 kubelet does not fill the sandbox's resources
(1.23 and later do): the API server is the only source here.

The agent runs on a topology file that splits this 2-CPU machine: the reserved CPU 0 on NUMA
node 0, CPU 1 on node 1. The Guaranteed pod asks for pod scope by annotation; its first
container takes 100m (shared CPUs), its second, larger one 1 CPU, which only node 1 has. The
kubelet merges the pod's one exclusive CPU and admits both containers on node 1; knowing only the
first container, nri-numa merged no CPU and gave it no node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.topology import discover
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e_k8s.kube import Json, Kube, container_statuses, wait_for
from tests.e2e_k8s.lab import Lab
from tests.e2e_k8s.pods import (RUN_TIMEOUT_S, container_cpus, delete_and_wait_gone,
                                describe_pods, pod_manifest)
from tests.e2e_k8s.test_kubelet_devices import nrt_zones

pytestmark = pytest.mark.k8s
GIB = 1 << 30
POD = "lab-whole-pod"


def split_machine() -> Topology:
    """CPU 0 (reserved) on NUMA node 0, CPU 1 on node 1; mems are never written (no Memory
    Manager): the kernel's single memory node is never asked for node 1."""
    cpus = (Cpu(id=0, numa=0, core=0, socket=0), Cpu(id=1, numa=1, core=1, socket=1))
    nodes = (NumaNode(id=0, cpus=frozenset({0}), memory_bytes=GIB, distances={0: 10, 1: 21}),
             NumaNode(id=1, cpus=frozenset({1}), memory_bytes=GIB, distances={0: 21, 1: 10}))
    return Topology(cpus=cpus, numa_nodes=nodes)


def two_container_pod() -> Json:
    pod = pod_manifest(POD, cpu="100m", memory="64Mi")
    small = pod["spec"]["containers"][0]
    small["name"] = "small"
    large = {**small, "name": "large",
             "resources": {"requests": {"cpu": "1", "memory": "64Mi"},
                           "limits": {"cpu": "1", "memory": "64Mi"}}}
    pod["spec"]["containers"].append(large)
    pod["metadata"]["annotations"] = {"numa.nri.io/topology-scope": "pod"}
    return pod


@pytest.fixture(scope="module")
def split_agent(lab: Lab, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The agent on the split machine; afterwards on this machine again, its NodeResourceTopology
    back (the tests after these read it)."""
    machine = tmp_path_factory.mktemp("whole-pod") / "split-cpu1-on-node1.json"
    machine.write_text(split_machine().to_json())
    listed = "this node's pods from the API server: "
    before = lab.agent_log.read_text(errors="replace").count(listed)
    lab.restart_agent(topology=machine)
    try:
        wait_for(lambda: lab.agent_log.read_text(errors="replace").count(listed) > before, 60.0,
                 "the restarted agent's export process to list the node's pods")
        yield machine
    finally:
        lab.restart_agent(topology=None)
        zones = len(discover("/").numa_nodes)
        wait_for(lambda: nrt_zones(kube) == zones, 30.0,
                 f"the NodeResourceTopology object to show this machine's {zones} zones again")


def test_a_pod_whose_second_container_is_larger_is_admitted_on_its_node(
        split_agent: Path, lab: Lab, kube: Kube, layout: CgroupLayout) -> None:
    kube.apply([two_container_pod()])
    try:
        def running() -> dict[str, str] | None:
            statuses = container_statuses(kube.pod(POD))
            if len(statuses) == 2 and all("running" in s.get("state", {}) for s in statuses):
                return {s["name"]: s["containerID"].split("://")[-1] for s in statuses}
            return None
        ids = wait_for(running, RUN_TIMEOUT_S, f"both containers of {POD} running",
                       describe=lambda: describe_pods(kube, [POD]))
        assert container_cpus(lab, layout, ids["large"]) == {1}
        log = lab.agent_log.read_text(errors="replace")
        lines = {name: next(line for line in log.splitlines()
                            if f"placed pod default/{POD} container {name}:" in line)
                 for name in ("small", "large")}
        for name, line in lines.items():  # both on node 1, as the kubelet admits the pod
            assert "policy single-numa-node, hint NUMA 1 (preferred)" in line, line
            assert line.endswith("pod known from the API server's pod spec"), line
    finally:
        delete_and_wait_gone(kube, lab, [POD])
