"""What the scheduler side wrote, read back: kube-scheduler's verdict on a pod, the extender's
chosen NUMA nodes on it, and the node state a node's agent publishes on its NodeResourceTopology
(what the extender's cache replays). Shared by the host lab's extender tests and the vm tier's
Kubernetes node."""

from __future__ import annotations

from nri_numa.cluster.node_state import ANNOTATION, NodeState, decode
from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION
from nri_numa.topology.cpulist import parse_list
from tests.e2e_k8s.kube import Json, Kube


def unschedulable(obj: Json | None) -> str | None:
    """The scheduler's message when it found no node for the pod; None while it has not."""
    for c in (obj or {}).get("status", {}).get("conditions", []) or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return c.get("message", "")
    return None


def failed_scheduling(kube: Kube, name: str) -> str | None:
    """The message of the pod's latest FailedScheduling event."""
    events = kube.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D"
                      + name)["items"]
    notes = [e.get("message") or e.get("note", "") for e in events
             if e.get("reason") == "FailedScheduling"]
    return notes[-1] if notes else None


def chosen(obj: Json) -> frozenset[int]:
    """The NUMA nodes the extender chose for the pod (empty: none written)."""
    text = (obj["metadata"].get("annotations") or {}).get(CHOSEN_NUMA_ANNOTATION)
    return parse_list(text) if text else frozenset()


def published(kube: Kube, node: str) -> NodeState:
    """The node state ``node``'s agent publishes; AssertionError when it publishes none."""
    obj = kube.get_if_present(f"/apis/{GROUP}/{VERSION}/{PLURAL}/{node}")
    annotations = (obj or {}).get("metadata", {}).get("annotations") or {}
    if ANNOTATION not in annotations:
        raise AssertionError(f"node {node} publishes no node state")
    return decode(annotations[ANNOTATION])


def ledger_numa_nodes(state: NodeState, uid: str) -> frozenset[int]:
    """The NUMA nodes the node's ledger aligned the pod to (its containers' hints)."""
    nodes: set[int] = set()
    for container in state.allocations.pod(uid).containers.values():
        nodes |= container.hint.affinity or frozenset()
    return frozenset(nodes)
