"""The extender against a real kube-apiserver v1.20.2 of its own (etcd + apiserver on free
127.0.0.1 ports, no kubelet): the NRT watch fills, updates and empties the cache, and bind
records the chosen NUMA nodes on a real pod and binds it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nri_numa.cluster.node_state import ANNOTATION, encode
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic.presets import preset_topology

pytest.importorskip("kubernetes")
from tests.e2e_k8s.apiserver import ApiServer  # noqa: E402
from tests.e2e_k8s.lab import LabUnavailable, find_binaries  # noqa: E402

NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
          "topologyManagerPolicy": "single-numa-node"}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    try:
        find_binaries()
    except LabUnavailable as e:
        pytest.skip(f"no Kubernetes binaries: {e}")
    server = ApiServer(Path(tmp_path_factory.mktemp("apiserver")))
    try:
        yield server, server.start()
    finally:
        server.stop()


def nrt(name: str, generation: int) -> dict:
    ledger = Ledger(EngineContext.build(preset_topology("dgx-h100"), config_from_mapping(CONFIG)))
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, generation)
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name, "annotations": {ANNOTATION: text}}, "zones": []}


def until(check, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_the_watch_follows_the_objects_and_bind_annotates_and_binds(api):
    from nri_numa.cluster.export_process import api_client
    from nri_numa.extender.cache import NodeCache
    from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION, Extender
    from nri_numa.extender.watch import ApiPods, watch_forever

    server, kube = api
    kube.request("POST", NRTS, nrt("early", 1))
    client = api_client(str(server.kubeconfig))
    cache = NodeCache()
    stop = threading.Event()
    thread = threading.Thread(target=watch_forever, args=(client, cache, stop), daemon=True)
    thread.start()
    try:
        until(lambda: cache.nodes() == ["early"])  # from the list
        kube.request("POST", NRTS, nrt("late", 1))
        until(lambda: cache.nodes() == ["early", "late"])  # from the watch
        current = kube.get(f"{NRTS}/late")
        current["metadata"]["annotations"][ANNOTATION] = nrt("late", 5)["metadata"][
            "annotations"][ANNOTATION]
        kube.request("PUT", f"{NRTS}/late", current)
        until(lambda: cache.entry("late").state.generation == 5)
        kube.request("DELETE", f"{NRTS}/early")
        until(lambda: cache.nodes() == ["late"])

        kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": "late"}})
        kube.request("POST", "/api/v1/namespaces/default/serviceaccounts",  # no controllers
                     {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        limits = {"cpu": "4", "memory": "1Gi"}
        pod = kube.request("POST", "/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"schedulerName": "nobody", "automountServiceAccountToken": False,
                     "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits}}]}})
        extender = Extender(cache, ApiPods(client), scheduler_name="nobody")
        assert extender.filter({"Pod": pod, "NodeNames": ["late"]})["NodeNames"] == ["late"]
        assert extender.bind({"PodNamespace": "default", "PodName": "p",
                              "PodUID": pod["metadata"]["uid"], "Node": "late"}) == {"Error": ""}
        bound = kube.get("/api/v1/namespaces/default/pods/p")
        assert bound["spec"]["nodeName"] == "late"
        assert bound["metadata"]["annotations"][CHOSEN_NUMA_ANNOTATION] in {"0", "1"}
        # Binding again: nothing to replay; filtered again, the API server shows it bound.
        again = {"PodNamespace": "default", "PodName": "p", "PodUID": pod["metadata"]["uid"],
                 "Node": "late"}
        assert "was not filtered" in extender.bind(again)["Error"]
        extender.filter({"Pod": pod, "NodeNames": ["late"]})
        assert "is already bound to late" in extender.bind(again)["Error"]
    finally:
        stop.set()
