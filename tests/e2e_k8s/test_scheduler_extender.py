"""Issue 13 on the lab: the real kube-scheduler v1.20.2 asks nri-numa's scheduler extender, over
the lab's real node (``localhost``: 2 CPUs, CPU 0 reserved) and four virtual nodes (two
dgx-h100, an amd-epyc-2s-nps4 and a gb200, kept by python -m nri_numa.cluster.virtual_nodes;
tests/e2e_k8s/extender_lab.py). Pods land only where the node's own engine admits them, a burst
leaves no node over-committed, and only kube-scheduler, with its client certificate and a
filter of the pod, can make the extender bind.

This machine has one NUMA node, where the extender has no choice to make for the real node.
What needs a real choice there (the node placing each pod on the NUMA nodes the extender chose,
a choice gone stale, the retries of a refused pod when its room is freed or the extender
restarts) runs on the vm tier's Kubernetes node, in the multi-NUMA guest
(tests/e2e_vm/test_k8s_node.py)."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from nri_numa.cluster.node_state import NodeState
from nri_numa.cluster.virtual_node_objects import TAINT_KEY, VIRTUAL_LABEL
from nri_numa.engine.admit import admit
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.runtime.to_request import with_scheduled_numa
from tests.e2e_k8s.extender_lab import EXTENDER, KEEPER, VIRTUAL_NODES, ExtenderLab
from tests.e2e_k8s.kube import Json, Kube, wait_for
from tests.e2e_k8s.lab import Lab
from tests.e2e_k8s.pods import SUMMARY, pod_manifest
from tests.e2e_k8s.scheduling import chosen, failed_scheduling, ledger_numa_nodes, published, unschedulable

pytestmark = pytest.mark.k8s
GPU = "nvidia.com/gpu"
DECIDED_S = 120.0  # a pod the scheduler cannot place is retried with growing back-off
PUBLISHED_S = 30.0
DGX_NODES = {n for n in VIRTUAL_NODES if "dgx-h100" in n}


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
        burstable: bool = False, anywhere: bool = False) -> Json:
    """A test pod that tolerates the virtual nodes' taint; on any node (``anywhere``) or on any
    virtual node."""
    manifest = pod_manifest(name, cpu, memory)
    spec = manifest["spec"]
    resources = spec["containers"][0].setdefault("resources", {"requests": {}, "limits": {}})
    if gpus:
        resources["requests"][GPU] = resources["limits"][GPU] = str(gpus)
    if burstable:
        resources["requests"] = {"cpu": "500m", "memory": memory}
        resources["limits"] = {"cpu": "1", "memory": memory}
    spec["tolerations"] = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if not anywhere:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": VIRTUAL_LABEL, "operator": "Exists"}]}]}}}
    return manifest




def wait_decided(kube: Kube, names: list[str], timeout_s: float = DECIDED_S) -> dict[str, Json]:
    """Every pod bound to a node or found unschedulable; name → the pod."""
    def decided() -> dict[str, Json] | None:
        pods = {p["metadata"]["name"]: p for p in kube.pods() if p["metadata"]["name"] in names}
        done = all(p["spec"].get("nodeName") or unschedulable(p) is not None
                   for p in pods.values())
        return pods if len(pods) == len(names) and done else None
    return wait_for(decided, timeout_s, f"{len(names)} pods bound or unschedulable", poll_s=0.5)










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


# --- (c) only kube-scheduler drives the extender ------------------------------------------------


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
