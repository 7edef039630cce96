"""nri-numa's DaemonSet on a real node whose API server enforces Node and RBAC authorization:
`kubectl apply -k` of packaging/kubernetes puts the agent in a pod of the image, as its
ServiceAccount; it places the node's pods (the checks of tests/e2e_k8s/test_node.py's kind) and
exports the node's NodeResourceTopology with exactly the permissions of its ClusterRole: each
rule taken away in turn breaks something."""

from __future__ import annotations

import pytest

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e_k8s.daemonset import (DAEMONSET, IMAGE, NAME, NAMESPACE, agent_pods,
                                     running_agent)
from tests.e2e_k8s.kube import ApiError, Json, Kube, wait_for
from tests.e2e_k8s.lab import NODE_NAME, Lab
from tests.e2e_k8s.pods import container_cpus, delete_and_wait_gone, pod_manifest, wait_running

pytestmark = pytest.mark.k8s
NRT_PATH = f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE_NAME}"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"


def nrt(kube: Kube) -> Json | None:
    try:
        return kube.get(NRT_PATH)
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def test_the_agent_runs_in_its_pod_and_places_the_nodes_pods(lab: Lab, kube: Kube,
                                                              layout: CgroupLayout) -> None:
    daemonset = kube.get(DAEMONSET)
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    pod = running_agent(kube)
    assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["serviceAccountName"] == NAME
    assert len(agent_pods(kube)) == 1

    kube.apply([pod_manifest("be"), pod_manifest("g1", cpu="1", memory="64Mi")])
    ids = wait_running(kube, ["be", "g1"])
    assert container_cpus(lab, layout, ids["g1"]) == {1}  # CPU 0 is reserved
    assert container_cpus(lab, layout, ids["be"]) == {0}  # the shared pool, without CPU 1
    obj = wait_for(lambda: (o := nrt(kube)) and o.get("metadata", {}).get("ownerReferences")
                   and o, 15.0, "the NodeResourceTopology, owned by the Node")
    node = kube.node(NODE_NAME)
    assert [(o["kind"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
        ("Node", node["metadata"]["uid"])]
    # The object was written by the agent's ServiceAccount (managedFields name its user agent;
    # the API server's audit would name the user: RBAC let only the ServiceAccount write).
    delete_and_wait_gone(kube, lab, ["be", "g1"])
