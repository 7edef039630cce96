"""Issue 13 on the lab: the real kube-scheduler v1.20.2 asks nri-numa's scheduler extender, over
the lab's real node (``localhost``: 2 CPUs, CPU 0 reserved) and four virtual nodes (two
dgx-h100, an amd-epyc-2s-nps4 and a gb200, kept by python -m nri_numa.cluster.virtual_nodes;
tests/e2e_k8s/extender_lab.py). Pods land only where the node's own engine admits them, a burst
leaves no node over-committed, and the real node places each pod on the NUMA nodes the extender
chose.

This machine has one NUMA node, where the extender has no choice to make (single-numa-node
leaves a hint equal to every node unset). For the real node's tests the agent runs on a topology
file that splits the machine into two NUMA nodes (`split_real_node`): the reserved CPU 0 on
node 0, CPU 1 on node 1. The extender's cache receives that publication through its watch, so it
chooses NUMA node 1, not the first one, for a pod with an exclusive CPU and writes it on the pod;
the agent places inside it, or logs that the choice went stale when a pod the scheduler never
saw took the CPU between the bind and the container's creation."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_numa.cluster.node_state import ANNOTATION, NodeState, decode
from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.cluster.virtual_node_objects import TAINT_KEY, VIRTUAL_LABEL
from nri_numa.engine.admit import admit
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION
from nri_numa.runtime.to_request import with_scheduled_numa
from nri_numa.topology import discover
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from tests.e2e.harness.cgroups import CgroupLayout, Cpuset, container_cgroup_path, read_cpuset
from tests.e2e.harness.image import IMAGE_REF
from tests.e2e_k8s.extender_lab import EXTENDER, KEEPER, VIRTUAL_NODES, ExtenderLab
from tests.e2e_k8s.kube import ApiError, Json, Kube, container_statuses, wait_for
from tests.e2e_k8s.lab import NODE_NAME, Lab
from tests.e2e_k8s.pods import (SUMMARY, container_cpus, describe_pods, pod_manifest,
                                wait_running)

pytestmark = pytest.mark.k8s
GPU = "nvidia.com/gpu"
DECIDED_S = 120.0  # a pod the scheduler cannot place is retried with growing back-off
PUBLISHED_S = 30.0
DGX_NODES = {n for n in VIRTUAL_NODES if "dgx-h100" in n}
GIB = 1 << 30


@pytest.fixture(scope="module")
def extender_lab(lab: Lab, kube: Kube) -> Iterator[ExtenderLab]:
    made = ExtenderLab(lab, kube)
    began = time.monotonic()
    try:
        made.up()
        SUMMARY.append(f"scheduler extender + {len(VIRTUAL_NODES)} virtual nodes up in "
                       f"{time.monotonic() - began:.1f} s")
        yield made
    finally:
        problems = made.down()
        assert not problems, f"putting the plain lab back left: {problems}"


# --- pods and what the cluster says of them -------------------------------------------------------


def pod(name: str, cpu: str | None = None, memory: str = "256Mi", gpus: int = 0,
        node: str | None = None, burstable: bool = False, anywhere: bool = False) -> Json:
    """A test pod that tolerates the virtual nodes' taint; on ``node`` (its hostname label), on
    any node (``anywhere``) or on any virtual node."""
    manifest = pod_manifest(name, cpu, memory)
    spec = manifest["spec"]
    resources = spec["containers"][0].setdefault("resources", {"requests": {}, "limits": {}})
    if gpus:
        resources["requests"][GPU] = resources["limits"][GPU] = str(gpus)
    if burstable:
        resources["requests"] = {"cpu": "500m", "memory": memory}
        resources["limits"] = {"cpu": "1", "memory": memory}
    spec["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    elif not anywhere:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": VIRTUAL_LABEL, "operator": "Exists"}]}]}}}
    return manifest


def unschedulable(obj: Json) -> str | None:
    """The scheduler's message when it found no node for the pod."""
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return c.get("message", "")
    return None


def wait_decided(kube: Kube, names: list[str], timeout_s: float = DECIDED_S) -> dict[str, Json]:
    """Every pod bound to a node or found unschedulable; name → the pod."""
    def decided() -> dict[str, Json] | None:
        pods = {p["metadata"]["name"]: p for p in kube.pods() if p["metadata"]["name"] in names}
        done = all(p["spec"].get("nodeName") or unschedulable(p) is not None
                   for p in pods.values())
        return pods if len(pods) == len(names) and done else None
    return wait_for(decided, timeout_s, f"{len(names)} pods bound or unschedulable", poll_s=0.5)


def failed_scheduling(kube: Kube, name: str) -> str | None:
    events = kube.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D"
                      + name)["items"]
    notes = [e.get("message") or e.get("note", "") for e in events
             if e.get("reason") == "FailedScheduling"]
    return notes[-1] if notes else None


def published(kube: Kube, node: str) -> NodeState:
    obj = kube.get(f"/apis/{GROUP}/{VERSION}/{PLURAL}/{node}")
    return decode(obj["metadata"]["annotations"][ANNOTATION])


def chosen(obj: Json) -> frozenset[int]:
    text = (obj["metadata"].get("annotations") or {}).get(CHOSEN_NUMA_ANNOTATION)
    return parse_list(text) if text else frozenset()


def ledger_numa_nodes(state: NodeState, uid: str) -> frozenset[int]:
    """The NUMA nodes the node's ledger aligned the pod to (its containers' hints)."""
    nodes: set[int] = set()
    for container in state.allocations.pod(uid).containers.values():
        nodes |= container.hint.affinity or frozenset()
    return frozenset(nodes)


def verdict(state: NodeState, manifest: Json) -> Any:
    """The node's engine on its published state: the decision for this pod."""
    ctx = EngineContext.build(state.topology, state.config)
    return admit(ctx, state.allocations, pod_from_manifest(manifest)).decision


def wait_published(kube: Kube, node: str, uids: set[str]) -> NodeState:
    """The node's publication once its ledger holds exactly ``uids``."""
    return wait_for(lambda: (lambda s: s if set(s.allocations.pods) == uids else None)(
        published(kube, node)), PUBLISHED_S, f"node {node} to publish its pods",
        poll_s=0.2, describe=lambda: str(sorted(published(kube, node).allocations.pods)))


def assert_no_virtual_node_over_committed(kube: Kube, bound: list[Json]) -> dict[str, list[Json]]:
    """Each virtual node's engine admits its whole bound set, each pod on the NUMA nodes the
    extender chose for it; the bound pods by node."""
    by_node: dict[str, list[Json]] = {node: [] for node in VIRTUAL_NODES}
    for obj in bound:
        by_node[obj["spec"]["nodeName"]].append(obj)  # a KeyError: a pod off the virtual nodes
    for node, objs in by_node.items():
        state = wait_published(kube, node, {o["metadata"]["uid"] for o in objs})
        # Replayed from an empty node in the order the node's ledger took them.
        ctx = EngineContext.build(state.topology, state.config)
        replay, by_uid = ctx.empty_allocations(), {o["metadata"]["uid"]: o for o in objs}
        for uid in state.allocations.pods:
            # As the node admitted it: inside the NUMA nodes the extender chose, while they fit.
            request, _ = with_scheduled_numa(pod_from_manifest(by_uid[uid]),
                                             (n.id for n in state.topology.numa_nodes))
            result = admit(ctx, replay, request)
            assert result.decision.admitted, f"{node} over-committed: {result.decision.rejection}"
            replay = result.allocations
            assert ledger_numa_nodes(state, uid) == chosen(by_uid[uid])
    return by_node


# --- (a) pods land only where the engine admits them ----------------------------------------------


def test_a_pod_that_fits_nowhere_stays_pending_with_each_nodes_reason(
        extender_lab: ExtenderLab, kube: Kube) -> None:
    # 120 exclusive CPUs: every virtual node has that many, none on one NUMA node
    # (single-numa-node for the pod); the real node has 2 CPUs.
    nowhere = pod("nowhere", cpu="120", memory="1Gi", anywhere=True)
    kube.apply([nowhere])
    note = wait_for(lambda: failed_scheduling(kube, "nowhere"), 60.0,
                    "the FailedScheduling event of pod nowhere")
    obj = kube.pod("nowhere")
    assert not obj["spec"].get("nodeName")
    condition = unschedulable(obj)
    print(f"FailedScheduling ({len(note)} characters): {note}")
    for node in VIRTUAL_NODES:
        decision = verdict(published(kube, node), obj)
        assert not decision.admitted
        reason = f"nri-numa: {decision.rejection.message}"
        assert reason in note, f"{node}'s reason is not in the event"
        assert reason in condition
    assert "Insufficient cpu" in note  # the real node: the scheduler's own count


def test_pods_land_where_the_engine_admits_them_on_the_numa_nodes_it_chose(
        extender_lab: ExtenderLab, kube: Kube) -> None:
    # 100 CPUs fit one NUMA node of a dgx-h100 (112) only; 4 GPUs on one NUMA node too: the
    # EPYC has 1 GPU per node, the GB200 2 per Grace. Counts alone fit every virtual node.
    wanted = [pod("cpu100", cpu="100", memory="1Gi"), pod("gpu4", cpu="8", gpus=4)]
    empty = {node: published(kube, node) for node in VIRTUAL_NODES}
    for manifest in wanted:
        refused = {n for n in VIRTUAL_NODES if not verdict(empty[n], manifest).admitted}
        assert refused == set(VIRTUAL_NODES) - DGX_NODES
    kube.apply(wanted)
    pods = wait_decided(kube, ["cpu100", "gpu4"])
    for name, obj in pods.items():
        node = obj["spec"].get("nodeName")
        assert node in DGX_NODES, f"{name} on {node}: {unschedulable(obj)}"
        assert chosen(obj) and len(chosen(obj)) == 1
    by_node: dict[str, set[str]] = {}
    for obj in pods.values():
        by_node.setdefault(obj["spec"]["nodeName"], set()).add(obj["metadata"]["uid"])
    for node, uids in by_node.items():
        state = wait_published(kube, node, uids)
        for obj in pods.values():
            if obj["spec"]["nodeName"] == node:
                assert ledger_numa_nodes(state, obj["metadata"]["uid"]) == chosen(obj)


# --- (b) a burst of 50 ------------------------------------------------------------------------------

SHAPES = (  # (prefix, cpu, gpus, burstable): 8 shapes, 50 pods; 43 GPUs asked, 28 there; the
    # six "wide" pods fit the CPU counts but no NUMA node: the extender must refuse them
    ("g4", "4", 0, False), ("gpu1", "8", 1, False), ("gpu2", "16", 2, False),
    ("gpu4", "24", 4, False), ("big", "48", 0, False), ("burst", None, 0, True),
    ("be", None, 0, False), ("wide", "120", 0, False))


def test_a_burst_of_50_pods_over_commits_no_node(extender_lab: ExtenderLab, kube: Kube,
                                                 lab: Lab) -> None:
    manifests = []
    for i in range(50):
        prefix, cpu, gpus, burstable = SHAPES[i % len(SHAPES)]
        manifests.append(pod(f"burst-{prefix}-{i}", cpu=cpu, gpus=gpus, burstable=burstable))
    names = [m["metadata"]["name"] for m in manifests]
    began = time.monotonic()
    kube.apply(manifests)
    pods = wait_decided(kube, names)
    took = time.monotonic() - began
    bound = {n: p for n, p in pods.items() if p["spec"].get("nodeName")}
    pending = {n: unschedulable(p) for n, p in pods.items() if not p["spec"].get("nodeName")}

    by_node = assert_no_virtual_node_over_committed(kube, list(bound.values()))
    for name, message in pending.items():
        assert message, f"{name} is pending without a reason"
    by_extender = [n for n, m in pending.items() if "nri-numa:" in m]
    wide = [n for n in names if "-wide-" in n]
    assert set(wide) <= set(pending), "a pod no NUMA node can hold was bound"
    assert by_extender, "no pod was refused by the extender: the burst tested nothing"
    assert "refuses pod" not in lab.log_tail(KEEPER, 2000)
    SUMMARY.append(f"scheduler extender burst: 50 pods decided in {took:.1f} s; bound "
                   + ", ".join(f"{n}: {len(o)}" for n, o in by_node.items())
                   + f"; pending {len(pending)} ({len(by_extender)} with nri-numa's reason)")
    print(SUMMARY[-1])


# --- (c) the real node places where the extender chose ------------------------------------------


def split_machine() -> Topology:
    """This machine's two CPUs on two NUMA nodes: the reserved CPU 0 on node 0, CPU 1 on node 1.
    The only CPU a Guaranteed pod can have lies on node 1, so a choice of node 1 is the
    extender's work, not a default. Every cpuset the agent can write exists on this machine;
    mems are never written (no Memory Manager: the kernel has memory node 0 only, so any
    placement of memory on node 1 could not be applied)."""
    cpus = (Cpu(id=0, numa=0, core=0, socket=0), Cpu(id=1, numa=1, core=1, socket=1))
    nodes = (NumaNode(id=0, cpus=frozenset({0}), memory_bytes=GIB, distances={0: 10, 1: 21}),
             NumaNode(id=1, cpus=frozenset({1}), memory_bytes=GIB, distances={0: 21, 1: 10}))
    return Topology(cpus=cpus, numa_nodes=nodes)


def published_numa_nodes(kube: Kube) -> int:
    """How many NUMA nodes the real node's published state has (0 while none can be read)."""
    try:
        return len(published(kube, NODE_NAME).topology.numa_nodes)
    except (ApiError, KeyError):
        return 0


@pytest.fixture(scope="module")
def split_real_node(extender_lab: ExtenderLab, lab: Lab, kube: Kube,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """The agent on `split_machine` while the extender runs, so its cache takes the new
    publication from the watch; afterwards the agent on this machine again, with its own state
    folder, and its publication back (test_too_many_guaranteed.py reads the node as it is)."""
    machine = split_machine()
    file = tmp_path_factory.mktemp("extender-split") / "split-cpu1-on-node1.json"
    file.write_text(machine.to_json())
    lab.restart_agent(topology=file)
    try:
        wait_for(lambda: published_numa_nodes(kube) == 2, PUBLISHED_S,
                 "the real node to publish the split machine's two NUMA nodes")
        yield machine
    finally:
        lab.restart_agent(topology=None)
        nodes = len(discover("/").numa_nodes)
        wait_for(lambda: published_numa_nodes(kube) == nodes, PUBLISHED_S,
                 f"the real node to publish this machine's {nodes} NUMA node(s) again")


def numa_nodes_of(machine: Topology, cpus: frozenset[int]) -> frozenset[int]:
    return frozenset(n.id for n in machine.numa_nodes if n.cpus & cpus)


def container_cpuset(lab: Lab, layout: CgroupLayout, container_id: str) -> Cpuset:
    client = lab.cri()
    try:
        return read_cpuset(layout, container_cgroup_path(client.container_info(container_id)))
    finally:
        client.close()


def test_the_real_node_places_each_pod_on_the_numa_nodes_the_extender_chose(
        split_real_node: Topology, kube: Kube, lab: Lab, layout: CgroupLayout) -> None:
    # Two Guaranteed 1-CPU pods at once: CPU 0 is reserved, so one fits, on NUMA node 1. The
    # second stays Pending with nri-numa's reason instead of reaching the node
    # (test_too_many_guaranteed.py).
    machine = split_real_node
    wanted = [pod("real-g-0", cpu="1", memory="64Mi", node=NODE_NAME),
              pod("real-g-1", cpu="1", memory="64Mi", node=NODE_NAME)]
    kube.apply(wanted)
    pods = wait_decided(kube, [m["metadata"]["name"] for m in wanted])
    bound = [n for n, p in pods.items() if p["spec"].get("nodeName") == NODE_NAME]
    assert len(bound) == 1, {n: unschedulable(p) for n, p in pods.items()}
    [name], [refused] = bound, set(pods) - set(bound)
    assert "nri-numa: TopologyAffinityError" in unschedulable(pods[refused])
    ids = wait_running(kube, bound)
    obj = kube.pod(name)
    uid = obj["metadata"]["uid"]
    state = wait_for(lambda: (lambda s: s if uid in s.allocations.pods else None)(
        published(kube, NODE_NAME)), PUBLISHED_S, "the real node to publish its pod")
    cpuset = container_cpuset(lab, layout, ids[name])
    placed = numa_nodes_of(machine, cpuset.cpu_ids)
    agent = ledger_numa_nodes(state, uid)
    print(f"{name}: extender chose {sorted(chosen(obj))}, agent aligned {sorted(agent)}, "
          f"cgroup CPUs {cpuset.cpus} on NUMA nodes {sorted(placed)}, mems {cpuset.mems}")
    # The extender wrote its choice (the split machine's, from the watch), and the agent's
    # ledger, its decision log and the container's cgroup all say that node.
    assert chosen(obj) == {1}
    assert agent == placed == chosen(obj)
    assert cpuset.cpu_ids == {1}  # its exclusive CPU; CPU 0 is reserved
    assert cpuset.mems == "0"  # untouched: the machine's only memory node
    log = lab.agent_log.read_text(errors="replace")
    assert (f"placed pod default/{name} container work: policy single-numa-node, hint NUMA 1 "
            "(preferred), cpus 1 (exclusive), mems unchanged") in log
    assert f"pod default/{name} container work: the scheduler's choice" not in log
    assert "CreateContainerError" not in str(kube.pod(refused).get("status"))


# --- (d) a choice gone stale between the bind and the container's creation -----------------------


def test_a_choice_taken_behind_the_schedulers_back_is_stale_and_the_node_decides_anew(
        split_real_node: Topology, kube: Kube, lab: Lab, layout: CgroupLayout) -> None:
    """The pod is bound with NUMA node 1 chosen; its init container (shared CPUs) holds it back
    until the test says so. Meanwhile a pod with ``spec.nodeName`` set, which no scheduler
    sees, takes CPU 1. When the app container is created the choice no longer holds: the agent
    logs it as stale, decides anew, and refuses under single-numa-node (no other CPU)."""
    late = pod("late", cpu="1", memory="64Mi", node=NODE_NAME)
    late["spec"]["initContainers"] = [{
        "name": "wait", "image": IMAGE_REF, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "until [ -e /tmp/go ]; do sleep 0.1; done"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                      "limits": {"cpu": "100m", "memory": "64Mi"}}}]
    kube.apply([late])
    obj = wait_decided(kube, ["late"])["late"]
    assert obj["spec"].get("nodeName") == NODE_NAME, unschedulable(obj)
    assert chosen(obj) == {1}
    wait_for(lambda: init_running(kube.pod("late")), 90.0, "late's init container running",
             describe=lambda: describe_pods(kube, ["late"]))

    behind = pod_manifest("behind-the-back", cpu="1", memory="64Mi")
    behind["spec"]["nodeName"] = NODE_NAME  # the kubelet runs it; no scheduler is asked
    kube.apply([behind])
    ids = wait_running(kube, ["behind-the-back"])
    assert container_cpus(lab, layout, ids["behind-the-back"]) == {1}
    stale_before = stale_count(lab)

    kube.kubectl("exec", "late", "-c", "wait", "--", "touch", "/tmp/go")

    def refused() -> Json | None:
        statuses = container_statuses(kube.pod("late"))
        waiting = statuses[0].get("state", {}).get("waiting") if statuses else None
        return waiting if waiting and waiting.get("reason") == "CreateContainerError" else None
    waiting = wait_for(refused, 90.0, "late's container refused",
                       describe=lambda: describe_pods(kube, ["late"]))
    assert "nri-numa: TopologyAffinityError: container work" in waiting.get("message", "")
    log = lab.agent_log.read_text(errors="replace")
    stale = ("pod default/late container work: the scheduler's choice of NUMA node 1 "
             "(numa.nri.io/scheduled-numa-nodes) is stale, decided anew: TopologyAffinityError: "
             "container work: Resources cannot be allocated with Topology locality inside NUMA "
             "nodes 1")
    assert stale in log
    assert "refused pod default/late container work: TopologyAffinityError" in log
    assert "pod default/late container wait: the scheduler's choice" not in log
    assert stale_count(lab) > stale_before
    # The pod the scheduler never saw keeps its CPU.
    assert container_cpus(lab, layout, ids["behind-the-back"]) == {1}


def init_running(obj: Json | None) -> bool:
    statuses = (obj or {}).get("status", {}).get("initContainerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


def stale_count(lab: Lab) -> float:
    """The agent's nri_numa_scheduled_numa_nodes_stale_total."""
    url = f"http://127.0.0.1:{lab.recorded.ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=5.0) as answer:  # noqa: S310 (127.0.0.1)
        text = answer.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("nri_numa_scheduled_numa_nodes_stale_total")]
    return sum(values)


# --- (e) only kube-scheduler drives the extender ------------------------------------------------


def extender_log_lines(lab: Lab, text: str) -> int:
    return sum(text in line for line in lab.log_tail(EXTENDER, 100000).splitlines())


def test_a_client_without_the_schedulers_certificate_or_a_filter_binds_nothing(
        extender_lab: ExtenderLab, kube: Kube, lab: Lab) -> None:
    """Every test above ran kube-scheduler through the extender's TLS with its client
    certificate. Here, a Pending pod no scheduler looks at, and a bind for it to a virtual
    node: without a certificate the connection is refused; with a certificate the client CA
    signed but no filter of that pod, the bind is refused. The pod stays unbound."""
    victim = pod("victim", cpu="1", memory="64Mi")
    victim["spec"]["schedulerName"] = "nobody"
    kube.apply([victim])
    uid = kube.pod("victim")["metadata"]["uid"]
    body = json.dumps({"PodNamespace": "default", "PodName": "victim", "PodUID": uid,
                       "Node": VIRTUAL_NODES[0]}).encode()
    refused_before = extender_log_lines(lab, "refused a connection from 127.0.0.1")
    url = f"{extender_lab.url}/nri-numa/bind"
    for context in (extender_lab.client_context(None), ssl.create_default_context()):
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            urllib.request.urlopen(urllib.request.Request(url, body), timeout=10,  # noqa: S310
                                   context=context).read()
    with pytest.raises((ConnectionError, urllib.error.URLError, http.client.HTTPException)):
        urllib.request.urlopen(urllib.request.Request(  # noqa: S310 (127.0.0.1)
            f"http://127.0.0.1:{extender_lab.extender_port}/nri-numa/bind", body),
            timeout=10).read()
    certified = extender_lab.client_context(extender_lab.certificates.scheduler)
    with urllib.request.urlopen(urllib.request.Request(url, body), timeout=10,  # noqa: S310
                                context=certified) as answer:
        error = json.loads(answer.read())["Error"]
    assert error.startswith("nri-numa: bind refused: pod default/victim") and "was not filtered" in error
    wait_for(lambda: extender_log_lines(lab, "refused a connection from 127.0.0.1")
             == refused_before + 3, 10.0, "one log line per refused connection",
             describe=lambda: lab.log_tail(EXTENDER, 10))
    assert extender_log_lines(lab, "bind refused: pod default/victim") == 1
    time.sleep(1.0)
    assert not kube.pod("victim")["spec"].get("nodeName")


# --- (f) a refused pod is retried when room appears ---------------------------------------------
# kube-scheduler retries an unschedulable pod on the events it knows of (a pod deleted, ...) or
# after a minute. Both tests make its own retry come too early on purpose, so that only the
# extender's retry can bind the pod in time: the node's publication held back until the
# scheduler has tried (and the extender refused) again, or the extender down while it tries.

RETRY_AFTER_FREE_S = 3.0  # the bounds of issue 25
RETRY_AFTER_RESTART_S = 5.0


def hold_the_only_cpu(kube: Kube) -> str:
    """``holder`` running on CPU 1 (the only exclusive CPU), ``waiter`` Pending with nri-numa's
    reason; holder's uid."""
    kube.apply([pod("holder", cpu="1", memory="64Mi", node=NODE_NAME)])
    wait_running(kube, ["holder"])
    kube.apply([pod("waiter", cpu="1", memory="64Mi", node=NODE_NAME)])
    wait_for(lambda: "nri-numa: TopologyAffinityError" in (unschedulable(kube.pod("waiter")) or ""),
             60.0, "waiter refused by nri-numa", describe=lambda: describe_pods(kube, ["waiter"]))
    return kube.pod("holder")["metadata"]["uid"]


def delete_holder(kube: Kube) -> None:
    """Delete ``holder`` and wait until its object is gone: kube-scheduler has seen the
    deletion and tried the waiter again."""
    kube.delete_pod("holder")
    wait_for(lambda: kube.pod("holder") is None, 90.0, "holder deleted")
    time.sleep(3.0)


def freed(kube: Kube, holder_uid: str) -> float:
    """The monotonic time at which the node's publication shows holder's CPU free."""
    wait_for(lambda: holder_uid not in published(kube, NODE_NAME).allocations.pods, 60.0,
             "the node to publish that holder's CPU is free", poll_s=0.05)
    return time.monotonic()


def wait_bound(kube: Kube, name: str, timeout_s: float = 90.0) -> float:
    wait_for(lambda: kube.pod(name)["spec"].get("nodeName"), timeout_s, f"{name} bound",
             poll_s=0.05, describe=lambda: describe_pods(kube, [name]))
    return time.monotonic()


def export_process(lab: Lab) -> int:
    """The pid of the agent's child that writes its NodeResourceTopology object."""
    agent = lab.recorded.pids["nri-numa"][0]
    [child] = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and _parent(p) == int(agent)]
    return child


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_refused_pod_is_bound_as_soon_as_the_cpu_it_waits_for_is_free(
        split_real_node: Topology, kube: Kube, lab: Lab) -> None:
    holder_uid = hold_the_only_cpu(kube)
    exporter = export_process(lab)
    os.kill(exporter, signal.SIGSTOP)  # publications wait: the scheduler's own retry finds no room
    try:
        delete_holder(kube)
        assert holder_uid in published(kube, NODE_NAME).allocations.pods
        assert not kube.pod("waiter")["spec"].get("nodeName")
    finally:
        os.kill(exporter, signal.SIGCONT)
    free = freed(kube, holder_uid)
    bound = wait_bound(kube, "waiter")
    SUMMARY.append(f"scheduler extender: waiter bound {bound - free:.2f} s after its CPU was "
                   "published free")
    print(SUMMARY[-1])
    assert bound - free <= RETRY_AFTER_FREE_S
    assert "localhost@" in kube.pod("waiter")["metadata"]["annotations"]["numa.nri.io/retry-for-room"]
    wait_running(kube, ["waiter"])


def test_after_an_extender_restart_the_refused_pods_are_retried_at_once(
        split_real_node: Topology, extender_lab: ExtenderLab, kube: Kube, lab: Lab) -> None:
    holder_uid = hold_the_only_cpu(kube)
    assert not lab._stop(EXTENDER)
    delete_holder(kube)  # the scheduler's retry on the deletion finds no extender
    freed(kube, holder_uid)
    time.sleep(10.0)  # past its back-off: the waiter sits in the unschedulable queue
    assert not kube.pod("waiter")["spec"].get("nodeName")
    restarted = time.monotonic()
    extender_lab.start_extender()
    bound = wait_bound(kube, "waiter")
    SUMMARY.append(f"scheduler extender: waiter bound {bound - restarted:.2f} s after the "
                   "extender's restart")
    print(SUMMARY[-1])
    assert bound - restarted <= RETRY_AFTER_RESTART_S
    wait_running(kube, ["waiter"])
