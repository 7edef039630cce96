"""Refusals the cluster acts on (docs/kubernetes.md, "Refusals"): a refused pod gets a Warning
Event with nri-numa's reason; one a controller owns is evicted after the configured number of
refusals and its controller makes a new one; a bare pod is never deleted, and says why on an
annotation. The lab runs the agent with --evict-after-refusals 2 --eviction-delay 0."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e_k8s.kube import ApiError, Json, Kube, wait_for
from tests.e2e_k8s.lab import EVICT_AFTER_REFUSALS, Lab
from tests.e2e_k8s.pods import TEST_LABEL, delete_and_wait_gone, pod_manifest, wait_running

pytestmark = pytest.mark.k8s
REASON = ("TopologyAffinityError: container work: Resources cannot be allocated with Topology "
          "locality (topology policy single-numa-node); cpu: asked 1 exclusive CPUs; free node 0: "
          "0 CPUs")
DEPLOYMENT = "d-refused"


def events_of(kube: Kube, uid: str) -> list[Json]:
    found = kube.get(f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.uid={uid}")
    return [e for e in found["items"] if e.get("source", {}).get("component") == "nri-numa"]


def deployment(name: str) -> Json:
    pod = pod_manifest(name, cpu="1", memory="64Mi")
    template = {"metadata": {"labels": {TEST_LABEL: "k8s", "app": name}}, "spec": pod["spec"]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {TEST_LABEL: "k8s"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": template}}


def pods_of(kube: Kube, app: str) -> list[Json]:
    return [p for p in kube.pods() if p["metadata"].get("labels", {}).get("app") == app]


@pytest.fixture
def one_cpu_taken(lab: Lab, kube: Kube) -> Iterator[None]:
    """CPU 1 held by a Guaranteed pod (CPU 0 is reserved): the next Guaranteed pod cannot fit."""
    kube.apply([pod_manifest("g-hold", cpu="1", memory="64Mi")])
    wait_running(kube, ["g-hold"])
    yield
    try:
        kube.request("DELETE", f"/apis/apps/v1/namespaces/default/deployments/{DEPLOYMENT}")
    except ApiError as e:
        if e.status != 404:
            raise
    wait_for(lambda: not pods_of(kube, DEPLOYMENT) or
             [delete_and_wait_gone(kube, lab, [p["metadata"]["name"] for p in pods_of(kube, DEPLOYMENT)])],
             120.0, "the deployment's pods gone")
    delete_and_wait_gone(kube, lab, ["g-hold"])


def test_a_bare_pod_refused_gets_the_event_and_the_annotation_and_is_never_deleted(
        lab: Lab, kube: Kube, one_cpu_taken: None) -> None:
    kube.apply([pod_manifest("g-bare", cpu="1", memory="64Mi")])
    uid = wait_for(lambda: (kube.pod("g-bare") or {}).get("metadata", {}).get("uid"), 30.0, "g-bare")
    [event] = wait_for(lambda: events_of(kube, uid), 60.0, "nri-numa's Event on g-bare")
    assert event["type"] == "Warning" and event["reason"] == "TopologyAffinityError"
    assert event["message"] == REASON
    assert event["involvedObject"]["fieldPath"] == "spec.containers{work}"
    annotations = wait_for(lambda: (kube.pod("g-bare") or {})["metadata"].get("annotations"), 30.0,
                           "the annotation on g-bare")
    assert annotations["numa.nri.io/refused"] == REASON
    # Refused again by the kubelet's retries: the Event counts them, the pod stays.
    counted = wait_for(lambda: [e for e in events_of(kube, uid)
                                if e["count"] > EVICT_AFTER_REFUSALS], 90.0,
                       f"more than {EVICT_AFTER_REFUSALS} refusals of g-bare")
    print(f"g-bare refused {counted[0]['count']} times, still there")
    pod = kube.pod("g-bare")
    assert pod is not None and pod["metadata"]["uid"] == uid
    assert pod["metadata"].get("deletionTimestamp") is None
    delete_and_wait_gone(kube, lab, ["g-bare"])


def test_a_deployments_pod_refused_is_evicted_and_its_controller_makes_another(
        lab: Lab, kube: Kube, one_cpu_taken: None) -> None:
    kube.apply([deployment(DEPLOYMENT)])
    [first] = wait_for(lambda: pods_of(kube, DEPLOYMENT), 30.0, "the deployment's first pod")
    uid = first["metadata"]["uid"]
    refused = wait_for(lambda: [e for e in events_of(kube, uid)
                                if e["reason"] == "TopologyAffinityError"], 60.0,
                       "nri-numa's Event on the deployment's pod")
    assert refused[0]["message"] == REASON
    evicted = wait_for(lambda: [e for e in events_of(kube, uid) if e["reason"] == "NriNumaEvicted"],
                       90.0, "the eviction Event")
    assert f"after {EVICT_AFTER_REFUSALS} refusals" in evicted[0]["message"]
    assert "ReplicaSet/" in evicted[0]["message"] and REASON in evicted[0]["message"]
    replacement = wait_for(lambda: [p for p in pods_of(kube, DEPLOYMENT)
                                    if p["metadata"]["uid"] != uid], 60.0,
                           "the replacement the ReplicaSet makes")
    print(f"evicted {first['metadata']['name']}; replacement {replacement[0]['metadata']['name']}")
    gone_or_going = [p for p in pods_of(kube, DEPLOYMENT) if p["metadata"]["uid"] == uid
                     and not p["metadata"].get("deletionTimestamp")]
    assert not gone_or_going, "the evicted pod is neither gone nor being deleted"
    assert f"pod default/{first['metadata']['name']} evicted by nri-numa" in \
        lab.agent_log.read_text(errors="replace")
