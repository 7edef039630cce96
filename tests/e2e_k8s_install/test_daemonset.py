"""nri-numa's DaemonSet on a real node whose API server enforces Node and RBAC authorization:
`kubectl apply -k` of packaging/kubernetes puts the agent in a pod of the image, as its
ServiceAccount; it places the node's pods (the checks of tests/e2e_k8s/test_node.py's kind) and
exports the node's NodeResourceTopology with exactly the permissions of its ClusterRole: each
rule taken away in turn breaks something."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import yaml
from kubernetes.utils import parse_quantity

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e_k8s.daemonset import (AGENT_SETTINGS, DAEMONSET, IMAGE, NAME, NAMESPACE, PACKAGE,
                                     agent_log, agent_pods, running_agent, wait_agent_connected)
from tests.e2e_k8s.kube import ApiError, Json, Kube, wait_for
from tests.e2e_k8s.lab import AGENT_SERVICE_ACCOUNT, NODE_NAME, Lab
from tests.e2e_k8s.pods import (TEST_LABEL, container_cpus, delete_and_wait_gone, pod_manifest,
                                wait_running)

pytestmark = pytest.mark.k8s
NRT_PATH = f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE_NAME}"
ROLE_FILE = PACKAGE / "nri-numa.yaml"
REFUSED = "numa.nri.io/refused"
ACTED_S = 5.0  # from the refusal to nri-numa's Event and annotation, the object made again
REFUSED_RS = "g-unfit-rs"  # a ReplicaSet of one pod refused as g-unfit is
REPLICA_SETS = "/apis/apps/v1/namespaces/default/replicasets"


def nrt(kube: Kube) -> Json | None:
    return kube.get_if_present(NRT_PATH)


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
    delete_and_wait_gone(kube, lab, ["be", "g1"])


def packaged_role() -> Json:
    [role] = [d for d in yaml.safe_load_all(ROLE_FILE.read_text()) if d["kind"] == "ClusterRole"]
    return role


def allowed(kube: Kube, rule: Json, verb: str) -> bool:
    resource, _, subresource = rule["resources"][0].partition("/")
    review = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": AGENT_SERVICE_ACCOUNT, "resourceAttributes": {
            "group": rule["apiGroups"][0], "resource": resource, "subresource": subresource,
            "verb": verb}}})
    return bool(review["status"].get("allowed"))


def audited(lab: Lab, decision: str = "allow", from_line: int = 0) -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every request nri-numa's ServiceAccount made
    that the API server decided so ("allow" or "forbid"), from the API server's audit log (its
    lines from ``from_line`` on)."""
    used = set()
    for line in lab.audit_log.read_text().splitlines()[from_line:]:
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        code = event.get("responseStatus", {}).get("code", 0)
        decided = event.get("annotations", {}).get("authorization.k8s.io/decision",
                                                   "allow" if code < 400 else "forbid")
        if event["user"]["username"] == AGENT_SERVICE_ACCOUNT and ref and decided == decision:
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            used.add((ref.get("apiGroup", ""), resource, event["verb"]))
    return used


def unfit_pod(kube: Kube) -> Json:
    """A Guaranteed pod the scheduler puts on the node (its memory fits the node's allocatable)
    that nri-numa refuses: more memory than NUMA node 0 holds once the ConfigMap's
    reservedMemory (1Gi) is set aside."""
    allocatable = kube.node(NODE_NAME)["status"]["allocatable"]["memory"]
    mebibytes = parse_quantity(allocatable) // 2**20 - 256
    return pod_manifest("g-unfit", cpu="1", memory=f"{mebibytes}Mi")


def replica_set(pod: Json) -> Json:
    """A ReplicaSet of one pod made from ``pod``'s spec, named REFUSED_RS."""
    template = {"metadata": {"labels": {TEST_LABEL: "k8s", "app": REFUSED_RS}}, "spec": pod["spec"]}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": REFUSED_RS, "labels": {TEST_LABEL: "k8s"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": REFUSED_RS}},
                     "template": template}}


def replica_set_pods(kube: Kube) -> list[Json]:
    return [p for p in kube.pods() if p["metadata"].get("labels", {}).get("app") == REFUSED_RS]


def delete_replica_set(kube: Kube) -> None:
    """The ReplicaSet deleted, its pods then by the garbage collector (not waited for)."""
    try:
        kube.request("DELETE", f"{REPLICA_SETS}/{REFUSED_RS}")
    except ApiError as e:
        if e.status != 404:
            raise


def wait_replica_set_gone(kube: Kube, lab: Lab) -> None:
    """Waits for the deleted ReplicaSet and its pods to be gone."""
    wait_for(lambda: kube.get_if_present(f"{REPLICA_SETS}/{REFUSED_RS}") is None, 30.0,
             f"ReplicaSet {REFUSED_RS} deleted")
    names = [p["metadata"]["name"] for p in replica_set_pods(kube)]
    if names:
        delete_and_wait_gone(kube, lab, names)


def evicted_at_its_refusal(lab: Lab, kube: Kube) -> bool:
    """Whether the pod of a ReplicaSet, refused as g-unfit is, goes (deleted or being deleted)
    within ACTED_S of the kubelet's event of its refused container: the agent's eviction at its
    first refusal (AGENT_SETTINGS); nothing else deletes it."""
    began = time.monotonic()
    kube.apply([replica_set(unfit_pod(kube))])
    try:
        [pod] = wait_for(lambda: replica_set_pods(kube), 30.0, f"the pod of {REFUSED_RS}")
        uid = pod["metadata"]["uid"]
        wait_for(lambda: [e for e in kube.get("/api/v1/namespaces/default/events?fieldSelector="
                                              f"involvedObject.uid={uid}")["items"]
                          if e["reason"] == "Failed" and e["source"].get("component") == "kubelet"],
                 30.0, f"the kubelet's event of {REFUSED_RS}'s refused container")
        refused = time.monotonic()
        evicted = wait_until(lambda: not [p for p in replica_set_pods(kube) if p["metadata"]["uid"] == uid
                                          and not p["metadata"].get("deletionTimestamp")], ACTED_S)
        print(f"{REFUSED_RS}'s pod refused {refused - began:.1f} s after the ReplicaSet was made; "
              + (f"evicted {time.monotonic() - refused:.1f} s after" if evicted else "not evicted"))
        return evicted
    finally:
        delete_replica_set(kube)


def what_works(lab: Lab, kube: Kube, eviction: bool) -> dict[str, bool]:
    """The agent's uses of the API server, each by the agent in a new pod (started after the
    role changed, so that its pod watch lists anew): the node's object made again after its
    deletion, owned by the Node; the pod watch without a refusal; a refused bare pod's Event and
    annotation; with ``eviction``, then (g-unfit deleted: the node has memory for one such pod)
    a refused ReplicaSet's pod evicted."""
    if nrt(kube) is not None:
        kube.request("DELETE", NRT_PATH)
    wait_for(lambda: nrt(kube) is None, 10.0, "the NodeResourceTopology deleted")
    old = running_agent(kube)
    before = lab._agent_connections()
    kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{old['metadata']['name']}")
    kube.delete_pod("g-unfit")  # the last round's, gone while the agent restarts
    pod = wait_agent_connected(lab, kube, before)
    delete_and_wait_gone(kube, lab, ["g-unfit"])
    wait_replica_set_gone(kube, lab)  # the last round's, deleted while the agent restarted
    kube.apply([unfit_pod(kube)])
    uid = wait_for(lambda: (kube.pod("g-unfit") or {}).get("metadata", {}).get("uid"), 30.0, "g-unfit")
    events = f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.uid={uid}"

    def by(component: str) -> list[Json]:
        return [e for e in kube.get(events)["items"] if e["source"].get("component") == component]

    def annotated() -> bool:
        return REFUSED in ((kube.pod("g-unfit") or {}).get("metadata", {}).get("annotations") or {})

    def owned() -> bool:
        return bool((nrt(kube) or {}).get("metadata", {}).get("ownerReferences"))

    # The kubelet's event of the failed CreateContainer: nri-numa has refused the container; its
    # export process acts on the refusal within milliseconds.
    wait_for(lambda: [e for e in by("kubelet") if e["reason"] == "Failed"], 30.0,
             "the kubelet's event of g-unfit's refused container")
    wait_until(lambda: owned() and by("nri-numa") and annotated(), ACTED_S)
    works = {"nrt": nrt(kube) is not None, "owner": owned(), "event": bool(by("nri-numa")),
             "annotation": annotated()}
    log = agent_log(pod)
    works["pod watch"] = "pod watch: " not in log
    if eviction:
        delete_and_wait_gone(kube, lab, ["g-unfit"])
        works["eviction"] = evicted_at_its_refusal(lab, kube)
    return works


def wait_until(check: Callable[[], object], seconds: float) -> bool:
    try:
        wait_for(check, seconds, "", poll_s=0.1)
    except TimeoutError:
        return False
    return True


def test_the_cluster_role_holds_exactly_what_the_agent_uses(lab: Lab, kube: Kube) -> None:
    """Every verb of the packaged ClusterRole is one the agent used (the API server's audit),
    and each rule taken away breaks one of the agent's uses of the API server, where the API
    server forbade the agent that rule's request (the audit again). Evictions at the first
    refusal (AGENT_SETTINGS), so that one round shows the eviction rule used."""
    print(f"the agent's settings in the ConfigMap: {AGENT_SETTINGS}")
    role = packaged_role()
    results: dict[str, dict[str, bool]] = {}
    forbidden: dict[str, set[tuple[str, str, str]]] = {}
    try:
        for taken in [None, *range(len(role["rules"]))]:
            rule = role["rules"][taken] if taken is not None else None
            rules = [r for r in role["rules"] if r is not rule]
            kube.apply([{**role, "rules": rules}])
            for kept in role["rules"]:  # RBAC follows the role through its informer
                for verb in kept["verbs"]:
                    wait_for(lambda kept=kept, verb=verb: allowed(kube, kept, verb) == (kept is not rule),
                             10.0, f"RBAC to follow the role: {verb} {kept['resources']}")
            label = "all rules" if rule is None else f"without {rule['verbs']} {rule['resources']}"
            began, audit_lines = time.monotonic(), len(lab.audit_log.read_text().splitlines())
            # The eviction's check costs a refused pod's deletion (a minute on the lab's
            # kubelet): only where it shows the eviction rule used and needed.
            eviction = rule is None or rule["resources"] == ["pods/eviction"]
            results[label] = what_works(lab, kube, eviction)
            forbidden[label] = audited(lab, "forbid", audit_lines)
            print(f"{label}: {results[label]} ({time.monotonic() - began:.1f} s); "
                  f"forbidden: {sorted(forbidden[label])}")
            if rule is None:
                used = audited(lab)
                granted = {(group, resource, verb) for r in role["rules"] for group in r["apiGroups"]
                           for resource in r["resources"] for verb in r["verbs"]}
                print(f"used: {sorted(used)}")
                assert used <= granted
                unused = granted - used
                # The event's patch counts a second refusal: one is seen at the kubelet's retry.
                assert unused <= {("", "events", "patch")}, f"granted, never used: {unused}"
    finally:
        kube.apply([role])
        wait_replica_set_gone(kube, lab)
    print(json.dumps(results, indent=1))
    assert all(results["all rules"].values()), results["all rules"]
    assert not forbidden["all rules"], forbidden["all rules"]
    for rule in role["rules"]:
        label = f"without {rule['verbs']} {rule['resources']}"
        assert not all(results[label].values()), f"{label}: nothing breaks {results[label]}"
        requests = {(rule["apiGroups"][0], rule["resources"][0], verb) for verb in rule["verbs"]}
        assert forbidden[label] & requests, f"{label}: none of its requests forbidden"
