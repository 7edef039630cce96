"""The scheduler extender's real node gets real choices: the Kubernetes lab's node (kubelet
1.20.2 with the systemd cgroup driver on cgroup v2, containerd 1.7.24, nri-numa) runs in the
multi-NUMA guest, its control plane (etcd, kube-apiserver, kube-scheduler, nri-numa's scheduler
extender) on the host's 127.0.0.1 (tests/e2e_vm/k8s_node.py). No topology file: the node's
NUMA nodes are the guest's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION
from nri_numa.topology.cpulist import parse_list
from tests.e2e_k8s.kube import ApiError, Json, Kube, running_container_id, wait_for
from tests.e2e_k8s.lab import LabUnavailable, find_binaries
from tests.e2e_k8s.pods import pod_manifest
from tests.e2e_vm import guest_plan
from tests.e2e_vm.conftest import _TIMES, Guest
from tests.e2e_vm.k8s_node import ControlPlane, copy_kubelet, wait_node
from tests.e2e_vm.layout import Layout

pytestmark = pytest.mark.vm
NODE = "numa-vm"  # the guest's hostname (scripts/vm-deps)
NODE_REGISTERED_S = 300.0
RUN_S = 180.0
DECIDED_S = 120.0


@dataclass
class K8sNode:
    kube: Kube
    guest: Guest


def guest_node(guest: Guest, command: str, plan: dict | None = None) -> dict:
    done = guest.run(["python3", "-m", "tests.e2e_vm.guest_node", command],
                     stdin=json.dumps(plan) if plan is not None else None, timeout_s=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "error" not in answer, f"{answer['error']}\n" + "\n".join(
        f"--- {unit} ---\n{text}" for unit, text in answer.get("journals", {}).items())
    return answer


@pytest.fixture(scope="module")
def k8s_node(guest: Guest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sNode]:
    try:
        binaries = find_binaries()
    except LabUnavailable as exc:
        pytest.skip(f"no Kubernetes binaries for the guest's node: {exc}")
    # A folder of its own, never the host lab's; its logs stay there.
    plane = ControlPlane(tmp_path_factory.mktemp("k8s-control-plane"))
    try:
        figures = plane.start(binaries)
        plane.start_tunnel(guest.vm)
        figures["kubelet_copy_s"] = copy_kubelet(guest.vm, binaries["kubelet"])
        layout = guest.layout
        reserved = ",".join(map(str, guest_plan.reserved_cpus(layout)))
        plan = {"kubelet": "/usr/local/bin/kubelet", "kubeconfig": plane.guest_kubeconfig(), "node": NODE,
                "kubelet_port": 10250,
                "agent_config": {"cpuManagerPolicy": "static", "reservedSystemCPUs": reserved,
                                 "topologyManagerPolicy": "single-numa-node",
                                 "cpuManagerPolicyOptions": {"full-pcpus-only": "true"}}}
        began = time.monotonic()
        figures.update(guest_node(guest, "up", plan))
        kube = plane.kube(binaries)
        figures["node_registered_s"] = wait_node(kube, NODE, NODE_REGISTERED_S)
        figures["kubelet_to_node_s"] = round(time.monotonic() - began, 1)
        _TIMES.append("kubernetes node in the guest: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        yield K8sNode(kube, guest)
    finally:
        try:
            down = guest_node(guest, "down")
            _TIMES.append("kubernetes node in the guest, tear-down: "
                          + ", ".join(f"{k} {v}" for k, v in down.items() if k != "problems"))
        finally:
            problems = plane.stop_tunnel() + plane.down()
        assert not problems and not down["problems"], (problems, down["problems"])


def nrt(kube: Kube) -> Json | None:
    try:
        return kube.get(f"/apis/{GROUP}/{VERSION}/{PLURAL}/{NODE}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def journal(node: K8sNode, unit: str) -> str:
    """The last lines of one of the node's units in the guest (for a failure's message)."""
    done = node.guest.run(["journalctl", "-u", unit, "-o", "cat", "--no-pager", "-n", "30"], check=False)
    return f"--- {unit} ---\n{done.stdout}"


def pod(name: str, cpus: int) -> Json:
    """A Guaranteed host-network pod (the guest has no pod network) for the guest's node."""
    manifest = pod_manifest(name, str(cpus), "64Mi")
    manifest["spec"].update(hostNetwork=True, nodeSelector={"kubernetes.io/hostname": NODE})
    return manifest


def container_cpus(node: K8sNode, container_id: str) -> frozenset[int]:
    """cpuset.cpus.effective of the container's scope in the guest (systemd driver, cgroup v2)."""
    done = node.guest.run(["sh", "-c", "cat /sys/fs/cgroup/kubepods.slice/*/cri-containerd-"
                                       f"{container_id}.scope/cpuset.cpus.effective"])
    return parse_list(done.stdout.strip())


def failed_scheduling(kube: Kube, name: str) -> str | None:
    events = kube.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D" + name)["items"]
    notes = [e.get("message", "") for e in events if e.get("reason") == "FailedScheduling"]
    return notes[-1] if notes else None


def test_the_node_topology_export_shows_the_guests_numa_nodes(k8s_node: K8sNode, vm_layout: Layout) -> None:
    obj = wait_for(lambda: nrt(k8s_node.kube), 60.0, "the guest node's NodeResourceTopology",
                   describe=lambda: journal(k8s_node, "nri-numa-node-agent"))
    zones = {z["name"]: z for z in obj["zones"] if z["type"] == "Node"}
    assert set(zones) == {f"node-{n.id}" for n in vm_layout.nodes}, sorted(zones)
    for n in vm_layout.nodes:
        cpu = {r["name"]: r for r in zones[f"node-{n.id}"]["resources"]}.get("cpu")
        assert (int(cpu["capacity"]) if cpu else 0) == len(n.cpus), zones[f"node-{n.id}"]


def test_a_guaranteed_pod_gets_cpus_of_the_real_numa_node_the_extender_chose(
        k8s_node: K8sNode, vm_layout: Layout) -> None:
    kube = k8s_node.kube
    cpus = guest_plan.threads(vm_layout)
    began = time.monotonic()
    kube.apply([pod("aligned", cpus)])
    obj = wait_for(lambda: (lambda p: p if running_container_id(p) else None)(kube.pod("aligned")), RUN_S,
                   "pod aligned to run in the guest",
                   describe=lambda: f"{json.dumps(kube.pod('aligned').get('status'))}\n"
                                    + journal(k8s_node, "nri-numa-node-agent") + journal(k8s_node, "nri-numa-node-kubelet"))
    _TIMES.append(f"pod aligned bound and running in the guest {time.monotonic() - began:.1f} s after its creation")
    chosen = parse_list(obj["metadata"]["annotations"][CHOSEN_NUMA_ANNOTATION])
    got = container_cpus(k8s_node, running_container_id(obj).split("://")[-1])
    [node] = [n for n in vm_layout.nodes if got & set(n.cpus)]
    assert len(got) == cpus and got <= set(node.cpus), got
    assert chosen == {node.id}, (chosen, got)
    assert not got & set(guest_plan.reserved_cpus(vm_layout))


def test_the_extender_keeps_pending_a_pod_the_node_cannot_align(k8s_node: K8sNode, vm_layout: Layout) -> None:
    kube = k8s_node.kube
    # More CPUs than any NUMA node has, fewer than the node's free ones: single-numa-node refuses.
    wide = max(len(n.cpus) for n in vm_layout.nodes) + guest_plan.threads(vm_layout)
    began = time.monotonic()
    kube.apply([pod("unaligned", wide)])
    note = wait_for(lambda: failed_scheduling(kube, "unaligned"), DECIDED_S,
                    "the FailedScheduling event of pod unaligned")
    assert not kube.pod("unaligned")["spec"].get("nodeName")
    # The engine's refusal, as the node's own agent would give it, in the scheduler's event.
    assert note.startswith("0/1 nodes are available: 1 nri-numa: TopologyAffinityError"), note
    assert f"asked {wide} exclusive CPUs" in note and "single-numa-node" in note, note
    _TIMES.append(f"pod unaligned found unschedulable in {time.monotonic() - began:.1f} s: {note}")
