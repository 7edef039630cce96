"""The lab is a working Kubernetes node: it registers Ready, the scheduler and the kubelet run a
BestEffort pod from `kubectl apply`, the pod gets an address on the CNI bridge, and `kubectl
exec` reaches its container (apiserver → kubelet on 127.0.0.1 → containerd)."""

from __future__ import annotations

import ipaddress

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, parse_status_allowed
from tests.e2e_k8s.kube import Kube
from tests.e2e_k8s.lab import K8S_VERSION, NODE_NAME, POD_SUBNET, Lab
from tests.e2e_k8s.pods import container_cpus, delete_and_wait_gone, pod_manifest, wait_running

pytestmark = pytest.mark.k8s
BOTH_CPUS = frozenset({0, 1})


def test_node_is_ready_and_runs_a_besteffort_pod(lab: Lab, kube: Kube, layout: CgroupLayout) -> None:
    node = kube.node(NODE_NAME)
    assert node is not None
    assert node["status"]["nodeInfo"]["kubeletVersion"] == K8S_VERSION
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.7.24")
    assert " Ready " in kube.kubectl("get", "nodes")

    print(kube.apply([pod_manifest("be")]))
    ids = wait_running(kube, ["be"])
    pod = kube.pod("be")
    assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["qosClass"] == "BestEffort"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_SUBNET)
    # No exclusive CPU is taken: the shared pool is every CPU, in the cgroup and inside.
    assert container_cpus(lab, layout, ids["be"]) == BOTH_CPUS
    inside = parse_status_allowed(kube.kubectl("exec", "be", "--", "cat", "/proc/self/status"))
    assert inside.cpu_ids == BOTH_CPUS
    delete_and_wait_gone(kube, lab, ["be"])
