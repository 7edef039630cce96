"""The extender against a real kube-apiserver v1.20.2 of its own (etcd + apiserver on free
127.0.0.1 ports, RBAC, no kubelet): the NRT watch fills, updates and empties the cache, bind
records the chosen NUMA nodes on a real pod and binds it, and the packaged ClusterRole holds
exactly what the extender uses: each of its permissions taken away in turn breaks something."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from nri_numa.cluster.node_state import ANNOTATION, encode
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic.presets import preset_topology
from tests.polling import until

pytest.importorskip("kubernetes")
from tests.e2e_k8s.apiserver import ApiServer  # noqa: E402
from tests.e2e_k8s.lab import LabUnavailable, find_binaries  # noqa: E402

NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
MANIFESTS = Path(__file__).parents[3] / "packaging" / "kubernetes" / "scheduler-extender.yaml"
EXTENDER_USER = "system:serviceaccount:kube-system:nri-numa-scheduler-extender"
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
          "topologyManagerPolicy": "single-numa-node"}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    try:
        find_binaries()
    except LabUnavailable as e:
        pytest.skip(f"no Kubernetes binaries: {e}")
    server = ApiServer(Path(tmp_path_factory.mktemp("apiserver")),
                       users={EXTENDER_USER: "extender-token-0123456789"})
    try:
        yield server, server.start()
    finally:
        server.stop()


def nrt(name: str, generation: int) -> dict:
    ledger = Ledger(EngineContext.build(preset_topology("dgx-h100"), config_from_mapping(CONFIG)))
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, generation)
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name, "annotations": {ANNOTATION: text}}, "zones": []}


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


# --- the packaged RBAC: nothing more than the extender uses -------------------------------------


def packaged_rbac() -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all(MANIFESTS.read_text())
            if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def permissions(role: dict) -> list[tuple[int, str]]:
    """Each (rule, verb) of the role."""
    return [(i, verb) for i, rule in enumerate(role["rules"]) for verb in rule["verbs"]]


def without(role: dict, taken: tuple[int, str] | None) -> dict:
    rules = []
    for i, rule in enumerate(role["rules"]):
        verbs = [v for v in rule["verbs"] if taken != (i, v)]
        if verbs:
            rules.append({**rule, "verbs": verbs})
    return {**role, "rules": rules}


def allowed(kube, rule: dict, verb: str) -> bool:
    review = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": EXTENDER_USER, "resourceAttributes": {
            "group": rule["apiGroups"][0], "resource": rule["resources"][0].split("/")[0],
            "subresource": "".join(rule["resources"][0].split("/")[1:]), "verb": verb}}})
    return bool(review["status"].get("allowed"))


def what_works(server, kube, run: int, caplog) -> dict[str, bool]:
    """The extender's uses of the API server, as its ServiceAccount, each done by its own
    code: the NRT list and watch, bind (read, annotate, Binding), the retries' list of the
    Pending pods it refused."""
    from nri_numa.cluster.export_process import api_client
    from nri_numa.extender.cache import NodeCache
    from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION, Extender
    from nri_numa.extender.watch import ApiPods, watch_forever

    client = api_client(str(server.user_kubeconfig(EXTENDER_USER)))
    works = {}
    caplog.clear()
    # One object before the watch starts, one after its first list: the second reaches the cache
    # only through the watch, or through a list again once the watch has failed and said so.
    listed, node = f"rbac-{run}-listed", f"rbac-{run}"
    kube.request("POST", NRTS, nrt(listed, 1))
    cache, stop = NodeCache(), threading.Event()
    threading.Thread(target=watch_forever, args=(client, cache, stop), daemon=True).start()
    try:
        first_list = wait_until(lambda: listed in cache.nodes(), 5.0)
        kube.request("POST", NRTS, nrt(node, 1))
        works["nrt list+watch"] = (first_list and wait_until(lambda: node in cache.nodes(), 5.0)
                                   and not any("NodeResourceTopology watch" in r.getMessage()
                                               for r in caplog.records))
    finally:
        stop.set()
    kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                           "metadata": {"name": node}})
    limits = {"cpu": "4", "memory": "1Gi"}
    pod = kube.request("POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{run}"},
        "spec": {"automountServiceAccountToken": False, "containers": [
            {"name": "main", "image": "x", "resources": {"limits": limits}}]}})
    pods = ApiPods(client)
    cache.observe(node, nrt(node, 1))  # the bind below does not depend on the watch
    extender = Extender(cache, pods)
    extender.filter({"Pod": pod, "NodeNames": [node]})
    answer = extender.bind({"PodNamespace": "default", "PodName": f"p-{run}",
                            "PodUID": pod["metadata"]["uid"], "Node": node})
    bound = kube.get(f"/api/v1/namespaces/default/pods/p-{run}")
    works["bind"] = (answer == {"Error": ""} and bound["spec"].get("nodeName") == node
                     and CHOSEN_NUMA_ANNOTATION in bound["metadata"].get("annotations", {}))
    pending = kube.request("POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pending-{run}"},
        "spec": {"automountServiceAccountToken": False, "containers": [
            {"name": "main", "image": "x"}]}})
    pending["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 nri-numa: TopologyAffinityError"}]}
    kube.request("PUT", f"/api/v1/namespaces/default/pods/pending-{run}/status", pending)
    try:
        works["retry list"] = f"pending-{run}" in {
            p.name for p in pods.refused_pending("default-scheduler")}
    except Exception:  # noqa: BLE001 - the client's ApiException: forbidden
        works["retry list"] = False
    return works


def wait_until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_packaged_cluster_role_holds_exactly_what_the_extender_uses(api, caplog):
    server, kube = api
    role, binding = packaged_rbac()
    kube.apply([binding, {"apiVersion": "v1", "kind": "ServiceAccount",  # no controllers here
                          "metadata": {"name": "default", "namespace": "default"}}])
    try:
        results = {}
        for run, taken in enumerate([None, *permissions(role)]):
            kube.apply([without(role, taken)])
            for i, verb in permissions(role):  # RBAC follows the role through its informer
                until(lambda i=i, verb=verb: allowed(kube, role["rules"][i], verb)
                      == ((i, verb) != taken))
            results[taken] = what_works(server, kube, run, caplog)
        print({str(k): v for k, v in results.items()})
        assert all(results[None].values()), results[None]
        for taken in permissions(role):
            rule = role["rules"][taken[0]]
            assert not all(results[taken].values()), (
                f"{taken[1]} {rule['resources']} is granted for nothing: {results[taken]}")
    finally:
        kube.apply([role])


def test_the_packaged_extender_manifests_are_accepted_by_a_real_api_server(api):
    """Every object of packaging/kubernetes/scheduler-extender.yaml (the NetworkPolicy, the
    Deployment's security context and TLS volume, the Service) passes the API server's own
    validation, server side, once the Deployment names its node; before, the API server refuses
    it and names the field."""
    import yaml

    _, kube = api
    documents = list(yaml.safe_load_all(MANIFESTS.read_text()))
    kinds = {d["kind"] for d in documents}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
                     "Service", "NetworkPolicy"}

    def dry_run() -> str:
        return kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": documents}))

    with pytest.raises(RuntimeError, match=r"spec\.template\.spec\.nodeName: Invalid value"):
        dry_run()
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["nodeName"] = "control-plane-0"
    out = dry_run()
    assert out.count("(server dry run)") == len(documents), out
