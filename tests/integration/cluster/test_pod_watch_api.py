"""The node's pods from a real kube-apiserver v1.20.2 (etcd + apiserver of their own, no kubelet):
the export process's watch (nri_numa.cluster.pod_watch) lists and follows the pods bound to its
node only, passes on a pod's containers and resources but not its status updates, and tells
deletions; run as the agent runs it (``python -m nri_numa.cluster.export_process --node``), its
messages fill the agent's PodSpecs through the ClusterFeed with the packaged ClusterRole's rights;
a client the server refuses costs one warning, not one per retry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nri_numa.engine.request import ContainerKind
from nri_numa.nri.whole_pod import PodSpecs
from tests.polling import until

pytest.importorskip("kubernetes")
from tests.e2e_k8s.apiserver import running_api_server  # noqa: E402
from tests.e2e_k8s.kube import ApiError  # noqa: E402

NODE = "watched-node"
PODS = "/api/v1/namespaces/default/pods"
AGENT_USER = "system:serviceaccount:kube-system:nri-numa"
MANIFESTS = Path(__file__).parents[3] / "packaging" / "kubernetes" / "nri-numa.yaml"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with running_api_server(Path(tmp_path_factory.mktemp("apiserver")),
                            users={AGENT_USER: "agent-token-0123456789abcdef"}) as found:
        yield found


def bound_pod(name: str, node: str = NODE) -> dict:
    guaranteed = {"cpu": "2", "memory": "1Gi"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     # (1.20's API server has no restartable init containers: no sidecar here)
                     "initContainers": [{"name": "setup", "image": "x",
                                         "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}],
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": guaranteed}}]}}


def delete(kube, name: str) -> None:
    try:
        kube.request("DELETE", f"{PODS}/{name}?gracePeriodSeconds=0")
    except ApiError as e:
        if e.status != 404:
            raise


class Said:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    def __call__(self, message: dict) -> None:
        self.messages.append(message)

    def kinds(self) -> list[str]:
        return [m["kind"] for m in self.messages]


def test_the_watch_follows_the_nodes_pods_and_no_others(api):
    from kubernetes import client as k8s

    from nri_numa.cluster.export_process import api_client
    from nri_numa.cluster.pod_watch import PodWatch

    server, kube = api
    early = kube.request("POST", PODS, bound_pod("early"))
    kube.request("POST", PODS, bound_pod("elsewhere", node="other-node"))
    said, stop = Said(), threading.Event()
    specs = PodSpecs()

    def say(message: dict) -> None:
        said(message)
        specs.handle(message)

    watcher = PodWatch(k8s.CoreV1Api(api_client(str(server.kubeconfig))), NODE, say, stop)
    threading.Thread(target=watcher.run, daemon=True).start()
    try:
        until(lambda: specs.synced)
        assert said.kinds() == ["pods"]
        assert [p["metadata"]["name"] for p in said.messages[0]["pods"]] == ["early"]
        spec = specs.get(early["metadata"]["uid"])
        assert [(c.name, c.kind, c.cpu_request) for c in spec.containers] == [
            ("setup", ContainerKind.INIT, 1000), ("main", ContainerKind.APP, 2000)]

        late = kube.request("POST", PODS, bound_pod("late"))
        until(lambda: specs.get(late["metadata"]["uid"]))
        # A status update is no news for the agent: nothing is sent.
        before = len(said.messages)
        status = kube.get(f"{PODS}/late")
        status["status"] = {"phase": "Pending", "message": "waiting"}
        kube.request("PUT", f"{PODS}/late/status", status)
        kube.request("POST", PODS, bound_pod("marker"))
        until(lambda: said.messages[-1].get("pod", {}).get("metadata", {}).get("name")
              == "marker")
        assert len(said.messages) == before + 1

        kube.request("DELETE", f"{PODS}/late?gracePeriodSeconds=0")
        until(lambda: specs.get(late["metadata"]["uid"]) is None)
        assert said.messages[-1] == {"kind": "pod-gone", "uid": late["metadata"]["uid"]}
        assert not any(m.get("pod", {}).get("metadata", {}).get("name") == "elsewhere"
                       for m in said.messages)
    finally:
        stop.set()
        for name in ("early", "elsewhere", "marker"):
            delete(kube, name)


def test_the_export_process_fills_the_agents_pod_specs(api):
    """As `nri-numa run` runs it: the child process with --node, its reports read by the
    ClusterFeed, the pod messages handed to PodSpecs, with the packaged ClusterRole's rights."""
    import yaml

    from nri_numa.cluster.feed import ClusterFeed, export_command

    server, kube = api
    for doc in yaml.safe_load_all(MANIFESTS.read_text()):
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            kind = "clusterroles" if doc["kind"] == "ClusterRole" else "clusterrolebindings"
            kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{kind}", doc)
    pod = kube.request("POST", PODS, bound_pod("fed"))
    specs = PodSpecs()
    feed = ClusterFeed(lambda: {"kind": "nothing"},
                       export_command(str(server.user_kubeconfig(AGENT_USER)), 60.0, False, 3,
                                      30.0, node=NODE),
                       on_pods=specs.handle)
    feed.start()
    try:
        spec = until(lambda: specs.get(pod["metadata"]["uid"]), 30)
        assert [c.name for c in spec.containers] == ["setup", "main"]
    finally:
        feed.stop()
        delete(kube, "fed")


def test_a_refused_client_costs_one_warning_however_often_it_is_retried(api):
    from kubernetes import client as k8s

    from nri_numa.cluster.export_process import api_client
    from nri_numa.cluster.pod_watch import PodWatch

    server, _ = api
    path = server.folder / "kubeconfig-bad-token"
    path.write_text(server.user_kubeconfig(AGENT_USER).read_text().replace(
        "agent-token-0123456789abcdef", "no-such-token"))
    said, stop = Said(), threading.Event()
    watcher = PodWatch(k8s.CoreV1Api(api_client(str(path))), NODE, said, stop)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        until(lambda: said.messages)
        time.sleep(1.6)  # three more tries: 0.5 s, 1 s
    finally:
        stop.set()
        thread.join(5)
    assert said.kinds() == ["log"]
    assert said.messages[0]["level"] == "warning" and "401" in said.messages[0]["message"]
