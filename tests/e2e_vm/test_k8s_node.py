"""The scheduler extender's real node gets real choices: the Kubernetes lab's node (kubelet
1.20.2 with the systemd cgroup driver on cgroup v2, containerd 1.7.24, nri-numa) runs in the
multi-NUMA guest, its control plane (etcd, kube-apiserver, kube-scheduler, nri-numa's scheduler
extender) on the host's 127.0.0.1 (tests/e2e_vm/k8s_node.py). No topology file: the node's
NUMA nodes are the guest's, and every check reads them from the tier's layout.

The node places each pod on the NUMA node the extender chose; a choice taken away behind the
scheduler's back between the bind and the container's creation is stale and the node decides
anew; a pod the extender refused is bound as soon as its room is published free, and at once
after an extender restart. The tests that need a node without pods delete those of the tests
before them (`empty_node`, `full_node`).

"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.engine.annotations import RETRY_FOR_ROOM
from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION
from nri_numa.topology.cpulist import format_list, parse_list
from tests.e2e_k8s.kube import Json, Kube, running_container_id, wait_for
from tests.e2e_k8s.lab import LabUnavailable, find_binaries
from tests.e2e_k8s.pods import describe_pods, pod_manifest, wait_running
from tests.e2e_k8s.scheduling import chosen, failed_scheduling, ledger_numa_nodes, published, unschedulable
from tests.e2e_vm import guest_plan
from tests.e2e_vm.conftest import _TIMES, Guest
from tests.e2e_vm.guest_node import AGENT_METRICS
from tests.e2e_vm.guest_node import UNITS as GUEST_UNITS
from tests.e2e_vm.k8s_node import ControlPlane, copy_kubelet, wait_node
from tests.e2e_vm.layout import Layout, Node

pytestmark = pytest.mark.vm
NODE = "numa-vm"  # the guest's hostname (scripts/vm-deps)
NODE_REGISTERED_S = 300.0
RUN_S = 180.0
DECIDED_S = 120.0
PUBLISHED_S = 60.0
GONE_S = 120.0
AGENT_UNIT = GUEST_UNITS[1]
# The bounds of issue 25: a refused pod bound this soon after its room is published free, or
# after the extender's restart (which includes the extender's own start).
RETRY_AFTER_FREE_S = 3.0
RETRY_AFTER_RESTART_S = 5.0


@dataclass
class K8sNode:
    kube: Kube
    guest: Guest
    plane: ControlPlane


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
        yield K8sNode(kube, guest, plane)
    finally:
        try:
            down = guest_node(guest, "down")
            _TIMES.append("kubernetes node in the guest, tear-down: "
                          + ", ".join(f"{k} {v}" for k, v in down.items() if k != "problems"))
        finally:
            problems = plane.stop_tunnel() + plane.down()
        assert not problems and not down["problems"], (problems, down["problems"])




def delete_every_pod(kube: Kube) -> None:
    """Every pod deleted, its object gone (the scheduler no longer counts it) and out of the
    node's published ledger. The guest's kubelet takes 10-30 s a pod under load, so the tests
    call this before they need an empty node, not after each test."""
    for obj in kube.pods():
        kube.delete_pod(obj["metadata"]["name"])
    wait_for(lambda: not kube.pods(), GONE_S, "every pod gone",
             describe=lambda: describe_pods(kube, [p["metadata"]["name"] for p in kube.pods()]))
    wait_for(lambda: not published(kube, NODE).allocations.pods, PUBLISHED_S,
             "the node to publish that it holds no pod")


@pytest.fixture
def empty_node(k8s_node: K8sNode) -> K8sNode:
    """The guest's node without pods."""
    delete_every_pod(k8s_node.kube)
    return k8s_node






def free_cpus(layout: Layout) -> dict[int, frozenset[int]]:
    """Each NUMA node with CPUs → its CPUs a Guaranteed pod can have on a node without pods."""
    reserved = set(guest_plan.reserved_cpus(layout))
    return {n.id: frozenset(n.cpus) - reserved for n in layout.nodes if n.cpus}


def node_of(layout: Layout, cpus: frozenset[int]) -> Node:
    """The one NUMA node holding all of ``cpus``."""
    [node] = [n for n in layout.nodes if cpus & set(n.cpus)]
    assert cpus <= set(node.cpus), (cpus, node)
    return node


def agent_log(node: K8sNode) -> str:
    """The guest agent's journal since this node's agent started (a guest left running by
    `numa-vm up` keeps the lines of earlier runs' agents)."""
    return node.guest.run(["sh", "-c", "journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID "
                                       f"--value {AGENT_UNIT}) -o cat --no-pager"]).stdout


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


def placed_cpus(node: K8sNode, pod_name: str, container_id: str, count: int) -> frozenset[int]:
    """The container's cgroup CPUs once they are ``count`` CPUs of one NUMA node. Read right after
    the pod runs they were once every CPU of the guest (the full tier, under load): widened
    after the container started, not by the agent. The agent's periodic check must then put
    them back, so a first read that is not the placement needs its "repaired" line."""
    first = container_cpus(node, container_id)

    def aligned() -> frozenset[int] | None:
        got = container_cpus(node, container_id)
        return got if len(got) == count and len({n for n in node.guest.layout.nodes if got & set(n.cpus)}) == 1 \
            else None
    got = wait_for(aligned, PUBLISHED_S, f"pod {pod_name}'s cgroup to hold {count} CPUs of one NUMA node",
                   poll_s=0.5, describe=lambda: f"cgroup CPUs {format_list(container_cpus(node, container_id))}")
    if first != got:
        _TIMES.append(f"pod {pod_name}: cgroup CPUs {format_list(first)} at first, {format_list(got)} after")
        assert f"repaired pod default/{pod_name} container work: cpus {format_list(got)}" in agent_log(node)
    return got








def running(node: K8sNode, names: list[str]) -> dict[str, str]:
    """name → the id (without the runtime's prefix) of its running container, once all run."""
    ids = wait_running(node.kube, names, RUN_S)
    return {name: cid.split("://")[-1] for name, cid in ids.items()}


def test_the_node_topology_export_shows_the_guests_numa_nodes(k8s_node: K8sNode, vm_layout: Layout) -> None:
    obj = wait_for(lambda: k8s_node.kube.get_if_present(f"/apis/{GROUP}/{VERSION}/{PLURAL}/{NODE}"), 60.0, "the guest node's NodeResourceTopology",
                   describe=lambda: journal(k8s_node, "nri-numa-node-agent"))
    zones = {z["name"]: z for z in obj["zones"] if z["type"] == "Node"}
    assert set(zones) == {f"node-{n.id}" for n in vm_layout.nodes}, sorted(zones)
    for n in vm_layout.nodes:
        cpu = {r["name"]: r for r in zones[f"node-{n.id}"]["resources"]}.get("cpu")
        assert (int(cpu["capacity"]) if cpu else 0) == len(n.cpus), zones[f"node-{n.id}"]


def test_a_guaranteed_pod_gets_cpus_of_the_real_numa_node_the_extender_chose(
        empty_node: K8sNode, vm_layout: Layout) -> None:
    """The extender writes its choice on the pod; the agent's ledger (as published), its
    decision line and the container's cgroup all say that NUMA node, and no stale choice."""
    k8s_node = empty_node
    kube = k8s_node.kube
    cpus = guest_plan.threads(vm_layout)
    began = time.monotonic()
    kube.apply([pod("aligned", cpus)])
    obj = wait_for(lambda: (lambda p: p if running_container_id(p) else None)(kube.pod("aligned")), RUN_S,
                   "pod aligned to run in the guest",
                   describe=lambda: f"{json.dumps(kube.pod('aligned').get('status'))}\n"
                                    + journal(k8s_node, AGENT_UNIT) + journal(k8s_node, "nri-numa-node-kubelet"))
    _TIMES.append(f"pod aligned bound and running in the guest {time.monotonic() - began:.1f} s after its creation")
    uid = obj["metadata"]["uid"]
    got = placed_cpus(k8s_node, "aligned", running_container_id(obj).split("://")[-1], cpus)
    node = node_of(vm_layout, got)
    assert len(got) == cpus, got
    assert chosen(obj) == {node.id}, (chosen(obj), got)
    assert not got & set(guest_plan.reserved_cpus(vm_layout))
    state = wait_for(lambda: (lambda s: s if uid in s.allocations.pods else None)(published(kube, NODE)),
                     PUBLISHED_S, "the node to publish pod aligned")
    assert ledger_numa_nodes(state, uid) == {node.id}
    log = agent_log(k8s_node)
    assert (f"placed pod default/aligned container work: policy single-numa-node, hint NUMA {node.id} "
            f"(preferred), cpus {format_list(got)} (exclusive)") in log
    assert "pod default/aligned container work: the scheduler's choice" not in log


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


# --- a choice gone stale between the bind and the container's creation ---------------------------

LATE_SIGNAL = "/run/nri-numa-test-late"  # a folder of the guest: its file "go" lets late's init end


def test_a_choice_taken_behind_the_schedulers_back_is_stale_and_the_node_decides_anew(
        empty_node: K8sNode, vm_layout: Layout) -> None:
    """Pod late is bound with a NUMA node X chosen; its init container (shared CPUs) holds it
    back until the test says so. Meanwhile a pod with ``spec.nodeName`` set, which no scheduler
    sees, takes every free CPU of X. When late's app container is created the choice no longer
    holds: the agent logs it as stale, counts it, and decides anew, on another NUMA node with
    room."""
    k8s_node = empty_node
    kube, guest = k8s_node.kube, k8s_node.guest
    cpus = guest_plan.threads(vm_layout)
    free = free_cpus(vm_layout)
    late = pod("late", cpus)
    late["spec"]["volumes"] = [{"name": "signal", "hostPath": {"path": LATE_SIGNAL, "type": "DirectoryOrCreate"}}]
    late["spec"]["initContainers"] = [{
        "name": "wait", "image": late["spec"]["containers"][0]["image"], "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "until [ -e /signal/go ]; do sleep 0.1; done"],
        "volumeMounts": [{"name": "signal", "mountPath": "/signal"}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}}]
    guest.run(["rm", "-rf", LATE_SIGNAL])
    try:
        kube.apply([late])
        wait_for(lambda: init_running(kube.pod("late")), RUN_S, "late's init container running",
                 describe=lambda: describe_pods(kube, ["late"]))
        [taken] = chosen(kube.pod("late"))
        others = {n for n, c in free.items() if n != taken and len(c) >= cpus}
        assert others, f"layout {vm_layout.name}: no other NUMA node has room for {cpus} CPUs"

        # It names X itself (the annotation the extender writes), so the node places it there.
        behind = pod("behind-the-back", len(free[taken]))
        del behind["spec"]["nodeSelector"]
        behind["spec"]["nodeName"] = NODE  # the kubelet runs it; no scheduler is asked
        behind["metadata"]["annotations"] = {CHOSEN_NUMA_ANNOTATION: str(taken)}
        kube.apply([behind])
        behind_id = running(k8s_node, ["behind-the-back"])["behind-the-back"]
        assert placed_cpus(k8s_node, "behind-the-back", behind_id, len(free[taken])) == free[taken]
        stale_before = stale_count(k8s_node)

        guest.run(["touch", f"{LATE_SIGNAL}/go"])
        late_id = running(k8s_node, ["late"])["late"]
    finally:
        guest.run(["rm", "-rf", LATE_SIGNAL])
    got = placed_cpus(k8s_node, "late", late_id, cpus)
    anew = node_of(vm_layout, got).id
    print(f"late: the extender chose NUMA node {taken}, behind-the-back took its CPUs "
          f"{format_list(free[taken])}, the node placed late on NUMA node {anew} (CPUs {format_list(got)})")
    assert anew in others and len(got) == cpus
    log = agent_log(k8s_node)
    assert (f"pod default/late container work: the scheduler's choice of NUMA node {taken} "
            f"({CHOSEN_NUMA_ANNOTATION}) is stale, decided anew: TopologyAffinityError: container work: "
            f"Resources cannot be allocated with Topology locality inside NUMA nodes {taken}") in log
    assert f"placed pod default/late container work: policy single-numa-node, hint NUMA {anew}" in log
    assert "pod default/late container wait: the scheduler's choice" not in log
    assert stale_count(k8s_node) == stale_before + 1
    # The pod the scheduler never saw keeps its CPUs.
    assert container_cpus(k8s_node, behind_id) == free[taken]


def init_running(obj: Json | None) -> bool:
    statuses = (obj or {}).get("status", {}).get("initContainerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


def stale_count(node: K8sNode) -> float:
    """The guest agent's nri_numa_scheduled_numa_nodes_stale_total."""
    read = ("import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
            f"'http://{AGENT_METRICS}/metrics', timeout=5).read().decode())")
    text = node.guest.run(["python3", "-c", read]).stdout
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("nri_numa_scheduled_numa_nodes_stale_total"))


# --- a refused pod is retried when room appears -------------------------------------------------
# kube-scheduler retries an unschedulable pod on the events it knows of (a pod deleted, ...) or
# after a minute. Both tests make its own retry come too early on purpose, so that only the
# extender's retry can bind the pod in time: the node's publication held back until the
# scheduler has tried (and the extender refused) again, or the extender down while it tries.


@dataclass
class FullNode:
    """Every NUMA node that has the most free CPUs (``cpus``) on an empty node held by one
    running pod of that many CPUs (``holders``, oldest first); the others have fewer free. Each
    retry test frees one holder's node and its waiter takes that node: the node is full again
    for the next one, without the guest's slow deletions of a fresh start."""
    node: K8sNode
    cpus: int
    holders: list[str]


@pytest.fixture(scope="module")
def full_node(k8s_node: K8sNode, vm_layout: Layout) -> FullNode:
    kube = k8s_node.kube
    delete_every_pod(kube)
    free = free_cpus(vm_layout)
    most = max(map(len, free.values()))
    holders = [f"holder-{i}" for i in range(sum(len(c) == most for c in free.values()))]
    kube.apply([pod(name, most) for name in holders])
    running(k8s_node, holders)
    return FullNode(k8s_node, most, holders)


def refused_waiter(full: FullNode, name: str) -> None:
    """Pod ``name``, asking for ``full.cpus``, Pending with nri-numa's reason: no NUMA node has
    that many free, though the node's CPU count has room (kube-scheduler's own filter passes)."""
    kube = full.node.kube
    kube.apply([pod(name, full.cpus)])
    wait_for(lambda: "nri-numa: TopologyAffinityError" in (unschedulable(kube.pod(name)) or ""), DECIDED_S,
             f"{name} refused by nri-numa", describe=lambda: describe_pods(kube, [name]))


def delete_holder(full: FullNode) -> str:
    """Delete the oldest holder and wait until its object is gone: kube-scheduler has seen the
    deletion and tried the waiting pod again. The holder's uid."""
    kube = full.node.kube
    holder = full.holders.pop(0)
    uid = kube.pod(holder)["metadata"]["uid"]
    kube.delete_pod(holder)
    wait_for(lambda: kube.pod(holder) is None, GONE_S, f"{holder} deleted")
    time.sleep(3.0)
    return uid


def freed(kube: Kube, holder_uid: str) -> float:
    """The monotonic time at which the node's publication shows the holder's CPUs free."""
    wait_for(lambda: holder_uid not in published(kube, NODE).allocations.pods, PUBLISHED_S,
             "the node to publish that the holder's CPUs are free", poll_s=0.05)
    return time.monotonic()


def wait_bound(kube: Kube, name: str) -> float:
    wait_for(lambda: kube.pod(name)["spec"].get("nodeName"), DECIDED_S, f"{name} bound",
             poll_s=0.05, describe=lambda: describe_pods(kube, [name]))
    return time.monotonic()


def signal_exporter(node: K8sNode, sig: str) -> None:
    """``kill -<sig>`` the guest agent's child that writes its NodeResourceTopology object."""
    main = node.guest.run(["systemctl", "show", "-p", "MainPID", "--value", AGENT_UNIT]).stdout.strip()
    [child] = node.guest.run(["sh", "-c", f"cat /proc/{main}/task/*/children"]).stdout.split()
    node.guest.run(["kill", f"-{sig}", child])


def test_a_refused_pod_is_bound_as_soon_as_the_cpus_it_waits_for_are_free(full_node: FullNode) -> None:
    k8s_node, kube = full_node.node, full_node.node.kube
    refused_waiter(full_node, "waiter-free")
    signal_exporter(k8s_node, "STOP")  # publications wait: the scheduler's own retry finds no room
    try:
        holder_uid = delete_holder(full_node)
        assert holder_uid in published(kube, NODE).allocations.pods
        assert not kube.pod("waiter-free")["spec"].get("nodeName")
    finally:
        signal_exporter(k8s_node, "CONT")
    free = freed(kube, holder_uid)
    bound = wait_bound(kube, "waiter-free")
    _TIMES.append(f"scheduler extender: waiter bound {bound - free:.2f} s after its CPUs were published free")
    print(_TIMES[-1])
    assert bound - free <= RETRY_AFTER_FREE_S
    assert kube.pod("waiter-free")["metadata"]["annotations"][RETRY_FOR_ROOM].startswith(f"{NODE}@")
    running(k8s_node, ["waiter-free"])
    full_node.holders.append("waiter-free")


def test_after_an_extender_restart_the_refused_pods_are_retried_at_once(full_node: FullNode) -> None:
    k8s_node, kube = full_node.node, full_node.node.kube
    refused_waiter(full_node, "waiter-restart")
    assert not k8s_node.plane.stop_extender()
    holder_uid = delete_holder(full_node)  # the scheduler's retry on the deletion finds no extender
    freed(kube, holder_uid)
    time.sleep(10.0)  # past its back-off: the waiter sits in the unschedulable queue
    assert not kube.pod("waiter-restart")["spec"].get("nodeName")
    restarted = time.monotonic()
    k8s_node.plane.start_extender()
    bound = wait_bound(kube, "waiter-restart")
    _TIMES.append(f"scheduler extender: waiter bound {bound - restarted:.2f} s after the extender's restart")
    print(_TIMES[-1])
    assert bound - restarted <= RETRY_AFTER_RESTART_S
    running(k8s_node, ["waiter-restart"])
    full_node.holders.append("waiter-restart")
