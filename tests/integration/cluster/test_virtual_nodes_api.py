"""The virtual-node keeper against a real kube-apiserver v1.20.2 of its own (etcd + apiserver on
free 127.0.0.1 ports, no kubelet, no controllers): it registers Ready Nodes with their Leases,
publishes each node's state, plays the node agent for the pods bound there, finishes their
deletion and removes everything it made."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nri_numa.cluster.node_state import ANNOTATION, decode
from nri_numa.cluster.virtual_node_objects import (LEASE_NAMESPACE, TAINT_KEY, VIRTUAL_LABEL,
                                                   default_config, parse_spec, virtual_nodes)
from nri_numa.topology.synthetic.presets import preset_topology

pytest.importorskip("kubernetes")
from tests.e2e_k8s.apiserver import ApiServer  # noqa: E402
from tests.e2e_k8s.kube import ApiError, Kube  # noqa: E402
from tests.e2e_k8s.lab import LabUnavailable, find_binaries  # noqa: E402

NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
DGX, GB200 = "t-dgx-h100-0", "t-gb200-0"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    try:
        find_binaries()
    except LabUnavailable as e:
        pytest.skip(f"no Kubernetes binaries: {e}")
    server = ApiServer(Path(tmp_path_factory.mktemp("apiserver")))
    try:
        kube = server.start()
        # The ServiceAccount admission plugin wants the namespace's account (no controller here).
        kube.request("POST", "/api/v1/namespaces/default/serviceaccounts",
                     {"metadata": {"name": "default"}})
        yield server, kube
    finally:
        server.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def guaranteed(name: str, node: str, cpu: str, gpus: int = 0) -> dict:
    amounts = {"cpu": cpu, "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "none", "resources": {
                         "requests": amounts, "limits": amounts}}]}}


def published(kube: Kube, node: str):
    return decode(kube.get(f"{NRTS}/{node}")["metadata"]["annotations"][ANNOTATION])


def test_the_keeper_registers_publishes_follows_pods_and_removes(api, caplog):
    from nri_numa.cluster.export_process import api_client
    from nri_numa.cluster.virtual_nodes import Keeper

    server, kube = api
    nodes = virtual_nodes([parse_spec("dgx-h100"), parse_spec("gb200")], default_config(), "t-")
    clock = Clock()
    keeper = Keeper(api_client(str(server.kubeconfig)), nodes, clock=clock)
    keeper.register()

    node = kube.node(DGX)
    assert node["status"]["capacity"]["cpu"] == "224"
    assert node["status"]["allocatable"]["cpu"] == "222"  # kubeReserved cpu 2
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"][VIRTUAL_LABEL] == "dgx-h100"
    # (and node.kubernetes.io/not-ready, which only the node lifecycle controller takes off)
    assert TAINT_KEY in [t["key"] for t in node["spec"]["taints"]]
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{DGX}")
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first_renewal = lease["spec"]["renewTime"]
    state = published(kube, GB200)
    assert state.topology == preset_topology("gb200")
    assert not state.allocations.pods

    # A pod bound to the node is placed on its ledger and published; one that cannot be
    # aligned there is refused, as the node's agent would refuse it, and not published.
    fits = kube.request("POST", "/api/v1/namespaces/default/pods",
                        guaranteed("fits", DGX, "8", gpus=2))
    kube.request("POST", "/api/v1/namespaces/default/pods", guaranteed("too-big", DGX, "120"))
    with caplog.at_level(logging.INFO, "nri_numa.virtual_nodes"):
        keeper.sync_pods()
    state = published(kube, DGX)
    assert set(state.allocations.pods) == {fits["metadata"]["uid"]}
    refusals = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert len(refusals) == 1 and "default/too-big" in refusals[0]
    assert "TopologyAffinityError" in refusals[0]
    first_node = {n.id for n in state.topology.numa_nodes
                  if state.allocations.pods[fits["metadata"]["uid"]].containers["c"].exclusive_cpus
                  <= n.cpus}

    # The extender's NUMA nodes are honoured as the node's agent honours them.
    other = max({n.id for n in state.topology.numa_nodes} - first_node)
    chosen = guaranteed("chosen", DGX, "4")
    chosen["metadata"]["annotations"] = {"numa.nri.io/scheduled-numa-nodes": str(other)}
    chosen = kube.request("POST", "/api/v1/namespaces/default/pods", chosen)
    keeper.sync_pods()
    state = published(kube, DGX)
    held = state.allocations.pods[chosen["metadata"]["uid"]].containers["c"].exclusive_cpus
    assert len(held) == 4 and held <= state.topology.numa_nodes[other].cpus
    kube.delete_pod("chosen")

    # The heartbeat renews the lease and the Ready condition.
    clock.now += 11
    keeper.heartbeat()
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{DGX}")
    assert lease["spec"]["renewTime"] > first_renewal
    heard = {c["type"]: c["lastHeartbeatTime"] for c in kube.node(DGX)["status"]["conditions"]}
    assert heard["Ready"] > node["status"]["conditions"][-1]["lastHeartbeatTime"]

    # A graceful delete waits for a kubelet; the keeper finishes it and releases the pod.
    kube.delete_pod("fits")
    assert kube.pod("fits")["metadata"]["deletionTimestamp"]
    keeper.sync_pods()
    assert kube.pod("fits") is None
    assert not published(kube, DGX).allocations.pods

    keeper.remove()
    assert kube.node(DGX) is None and kube.node(GB200) is None
    assert kube.pod("too-big") is None
    for path in (f"{NRTS}/{DGX}", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}"
                 f"/leases/{GB200}"):
        with pytest.raises(ApiError) as gone:
            kube.get(path)
        assert gone.value.status == 404


def test_a_node_left_by_an_earlier_keeper_is_taken_over(api):
    from nri_numa.cluster.export_process import api_client
    from nri_numa.cluster.virtual_nodes import Keeper

    server, kube = api
    nodes = virtual_nodes([parse_spec("gb200")], default_config(), "t-")
    client = api_client(str(server.kubeconfig))
    Keeper(client, nodes).register()
    again = Keeper(client, nodes, clock=lambda: 1_900_000_000.0)
    again.register()  # 409 on create: patched instead
    node = kube.node(GB200)
    assert node["status"]["conditions"][-1]["lastHeartbeatTime"].startswith("2030-")
    again.remove()
    assert kube.node(GB200) is None
