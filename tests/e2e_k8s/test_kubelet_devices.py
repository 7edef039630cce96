"""The real kubelet's PodResources answers steer nri-numa's placement (issue 12's last done-when),
as the fake kubelet's do in tests/e2e/test_nri_podresources.py.

The lab's kubelet (v1.20.2) gets devices from nri-numa's fake device plugin
(``python -m nri_numa.fake_device_plugin``, started by ``Lab.start_device_plugin``): two
``example.com/gpu`` devices whose NUMA node the plugin reports (ListAndWatch's TopologyInfo),
``lab-gpu-node0`` on node 0 and ``lab-gpu-node1`` on node 1. This machine has CPUs 0-1 on one NUMA
node, so for these tests the agent runs on a topology file that splits it, as the fake-kubelet
test does: node 0 holds CPU 1, node 1 holds CPU 0 (the reserved CPU). Every cpuset the agent can
write then exists on the real machine. The topology names no GPU, and the device ids name
nothing nri-numa could look up: the only way the agent can learn a device's node is the
kubelet's PodResources ``List`` (1.20 has no ``Get``), which passes on what the plugin reported.

Both pods are the same Guaranteed pod: 1 CPU, 64Mi and one ``example.com/gpu``. Which device the
kubelet gives is decided by health: the plugin's file marks one of the two unhealthy, so the
kubelet's device manager can only choose the other. Then:

* the kubelet gives ``lab-gpu-node1`` (node 1): no free CPU there, so nri-numa refuses the
  container under single-numa-node (CreateContainerError with its TopologyAffinityError);
* the kubelet gives ``lab-gpu-node0`` (node 0): the container gets CPU 1 with hint NUMA 0.

The pod, the agent and the machine are the same in both; only the kubelet's device choice
differs, and the placement follows it. That is steering: with no answer from the kubelet the
first pod would have been placed on CPU 1 as well. Each test also reads the kubelet's own
``List`` to show that it did give that device (with the plugin's NUMA node), the plugin's log
that the kubelet allocated it, and for the placed pod the container's environment that the
kubelet handed Allocate's answer on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.podresources.client import PodResourcesClient
from nri_numa.topology import discover
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e_k8s.kube import ApiError, Json, Kube, container_statuses, wait_for
from tests.e2e_k8s.lab import DEVICE_PLUGIN, NODE_NAME, Lab
from tests.e2e_k8s.pods import (container_cpus, delete_and_wait_gone, describe_pods,
                                pod_manifest, wait_running)

pytestmark = pytest.mark.k8s
GPU = "example.com/gpu"
NEAR, FAR = "lab-gpu-node0", "lab-gpu-node1"
GIB = 1 << 30


def split_machine() -> Topology:
    """This machine's two CPUs on two NUMA nodes: CPU 1 on node 0, CPU 0 (reserved) on node 1."""
    cpus = (Cpu(id=0, numa=1, core=0, socket=1), Cpu(id=1, numa=0, core=1, socket=0))
    nodes = (NumaNode(id=0, cpus=frozenset({1}), memory_bytes=GIB, distances={0: 10, 1: 21}),
             NumaNode(id=1, cpus=frozenset({0}), memory_bytes=GIB, distances={0: 21, 1: 10}))
    return Topology(cpus=cpus, numa_nodes=nodes)


def devices_yaml(healthy: str) -> str:
    """Both devices with their NUMA nodes; only ``healthy`` can be given."""
    def health(device: str) -> str:
        return "Healthy" if device == healthy else "Unhealthy"
    return (f"resource: {GPU}\ndevices:\n"
            f"  - {{id: {NEAR}, numa: [0], health: {health(NEAR)}}}\n"
            f"  - {{id: {FAR}, numa: [1], health: {health(FAR)}}}\n")


def gpu_pod(name: str) -> Json:
    pod = pod_manifest(name, cpu="1", memory="64Mi")
    resources = pod["spec"]["containers"][0]["resources"]
    resources["requests"][GPU] = resources["limits"][GPU] = "1"
    return pod


@pytest.fixture(scope="module")
def device_file(lab: Lab, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The agent on the split machine and the fake device plugin serving the kubelet; both
    undone afterwards (the agent back on the machine's own topology)."""
    folder = tmp_path_factory.mktemp("kubelet-devices")
    machine = folder / "split-machine.json"
    machine.write_text(split_machine().to_json())
    devices = folder / "devices.yaml"
    devices.write_text(devices_yaml(healthy=FAR))
    lab.restart_agent(topology=machine)
    try:
        lab.start_device_plugin(devices)
        # The scheduler places the pods only once the node shows the resource (one healthy device).
        wait_for(lambda: (kube.node(NODE_NAME) or {}).get("status", {}).get("allocatable", {})
                 .get(GPU) == "1", 60.0, f"node {NODE_NAME} to show 1 allocatable {GPU}")
        yield devices
    finally:
        problems = lab.stop_device_plugin()
        lab.restart_agent(topology=None)
        # The tests after these read the NodeResourceTopology object: wait until the agent has
        # put this machine's zones back in place of the split machine's.
        zones = len(discover("/").numa_nodes)
        wait_for(lambda: nrt_zones(kube) == zones, 30.0,
                 f"the NodeResourceTopology object to show this machine's {zones} zones again")
        assert not problems, problems


def nrt_zones(kube: Kube) -> int:
    """How many zones the node's NodeResourceTopology object shows (0 while there is none)."""
    try:
        found = kube.get(f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE_NAME}")
    except ApiError as e:
        if e.status == 404:
            return 0
        raise
    return len(found.get("zones", []))


def advertise(lab: Lab, devices: Path, healthy: str) -> None:
    """Rewrite the plugin's file and wait until it has sent the new list to the kubelet."""
    said_before = lab.log_tail(DEVICE_PLUGIN, 10_000).count("advertising ")
    devices.write_text(devices_yaml(healthy))
    wait_for(lambda: lab.log_tail(DEVICE_PLUGIN, 10_000).count("advertising ") > said_before, 10.0,
             "the fake device plugin to advertise the new list")


def kubelet_devices(lab: Lab, pod: str) -> list[tuple[str, list[str], list[int]]]:
    """What the real kubelet's PodResources List says container ``work`` of ``pod`` holds."""
    with PodResourcesClient(str(lab.pod_resources_socket)) as client:
        listed = client.list(timeout_s=5)
    return [(group.resource_name, list(group.device_ids), [n.ID for n in group.topology.nodes])
            for entry in listed if entry.namespace == "default" and entry.name == pod
            for container in entry.containers if container.name == "work"
            for group in container.devices]


def test_the_kubelet_giving_the_gpu_on_the_node_without_free_cpus_gets_the_pod_refused(
        lab: Lab, kube: Kube, device_file: Path) -> None:
    advertise(lab, device_file, healthy=FAR)
    kube.apply([gpu_pod("gpu-far")])

    def waiting() -> Json | None:
        statuses = container_statuses(kube.pod("gpu-far"))
        state = statuses[0].get("state", {}).get("waiting") if statuses else None
        return state if state and state.get("reason") == "CreateContainerError" else None
    state = wait_for(waiting, 90.0, "gpu-far waiting with CreateContainerError",
                     describe=lambda: describe_pods(kube, ["gpu-far"]))
    assert "nri-numa: TopologyAffinityError: container work: Resources cannot be allocated with " \
           "Topology locality (topology policy single-numa-node)" in state.get("message", ""), state

    assert kubelet_devices(lab, "gpu-far") == [(GPU, [FAR], [1])]  # the kubelet's own answer
    assert f"Allocate: {FAR}" in lab.log_tail(DEVICE_PLUGIN, 10_000)
    log = lab.agent_log.read_text(errors="replace")
    assert "kubelet has no PodResources Get" in log  # 1.20: the answer came from List
    assert "refused pod default/gpu-far container work: TopologyAffinityError" in log
    delete_and_wait_gone(kube, lab, ["gpu-far"])


def test_the_kubelet_giving_the_gpu_on_the_node_with_the_free_cpu_places_the_pod_there(
        lab: Lab, kube: Kube, layout: CgroupLayout, device_file: Path) -> None:
    advertise(lab, device_file, healthy=NEAR)
    kube.apply([gpu_pod("gpu-near")])
    ids = wait_running(kube, ["gpu-near"])

    assert kubelet_devices(lab, "gpu-near") == [(GPU, [NEAR], [0])]
    assert container_cpus(lab, layout, ids["gpu-near"]) == frozenset({1})
    assert "placed pod default/gpu-near container work: policy single-numa-node, hint NUMA 0 " \
           "(preferred), cpus 1 (exclusive)" in lab.agent_log.read_text(errors="replace")
    plugin_log = lab.log_tail(DEVICE_PLUGIN, 10_000)
    assert f"Allocate: {NEAR}" in plugin_log and f"PreStartContainer: {NEAR}" in plugin_log
    # Allocate's answer reached the container through the kubelet and containerd.
    assert f"FAKE_DEVICE_0={NEAR}" in kube.kubectl("exec", "gpu-near", "--", "env").splitlines()
    delete_and_wait_gone(kube, lab, ["gpu-near"])


def test_after_a_kubelet_restart_the_plugin_registers_again_and_its_devices_still_steer(
        lab: Lab, kube: Kube, layout: CgroupLayout, device_file: Path) -> None:
    """A restarted kubelet empties its device plugin folder and makes a new kubelet.sock; the
    plugin serves on a new socket and registers again, and the kubelet hands its devices out."""
    advertise(lab, device_file, healthy=NEAR)
    registered_before = lab.log_tail(DEVICE_PLUGIN, 10_000).count("registered ")
    lab.stop("kubelet")
    lab.restart("kubelet")
    wait_for(lambda: lab.log_tail(DEVICE_PLUGIN, 10_000).count("registered ") > registered_before,
             60.0, "the fake device plugin to register with the restarted kubelet")
    assert "again (a new kubelet.sock)" in lab.log_tail(DEVICE_PLUGIN, 10)

    kube.apply([gpu_pod("gpu-after-restart")])
    ids = wait_running(kube, ["gpu-after-restart"])
    assert kubelet_devices(lab, "gpu-after-restart") == [(GPU, [NEAR], [0])]
    assert container_cpus(lab, layout, ids["gpu-after-restart"]) == frozenset({1})
    delete_and_wait_gone(kube, lab, ["gpu-after-restart"])
