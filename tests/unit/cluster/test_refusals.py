"""What a refusal leads to: an Event every time (counted per reason), an annotation on a bare
pod, an eviction of a controller's pod after enough refusals and time, never twice; and what a
degraded container leads to: one Warning Event, nothing else."""

from __future__ import annotations

import pytest

from nri_numa.cluster.refusals import (DEGRADED_REASON, EvictionPolicy, Refusal, RefusalTracker,
                                       controller_of, degraded_message, event_body, event_name,
                                       message_handlers, refusal_message)


def refusal(at: float, reason: str = "TopologyAffinityError", uid: str = "u1",
            message: str = "TopologyAffinityError: no room") -> Refusal:
    return Refusal.from_message(refusal_message("default", "web-1", uid, "work", reason, message,
                                                "node-a", at))


def test_a_controllers_pod_is_evicted_after_the_repeats_and_the_delay_and_only_once():
    tracker = RefusalTracker(EvictionPolicy(evict=True, repeats=3, delay_s=30.0))
    seen = [tracker.refused(refusal(t), owned_by_controller=True) for t in (0, 10, 20, 35, 60)]
    assert [a.evict for a in seen] == [False, False, False, True, False]
    assert [a.event_count for a in seen] == [1, 2, 3, 4, 5]
    assert not any(a.annotate for a in seen)


def test_a_failed_eviction_is_tried_again_at_the_next_refusal():
    tracker = RefusalTracker(EvictionPolicy(repeats=1, delay_s=0))
    assert tracker.refused(refusal(0), True).evict
    tracker.eviction_failed("u1")
    assert tracker.refused(refusal(1), True).evict


@pytest.mark.parametrize("evict", [True, False])
def test_a_bare_pod_is_never_evicted_and_is_annotated_when_the_reason_changes(evict):
    tracker = RefusalTracker(EvictionPolicy(evict=evict, repeats=1, delay_s=0))
    first = tracker.refused(refusal(0), owned_by_controller=False)
    again = tracker.refused(refusal(5), owned_by_controller=False)
    other = tracker.refused(refusal(9, "DeviceError", message="DeviceError: gone"), False)
    assert not (first.evict or again.evict or other.evict)
    assert (first.annotate, again.annotate, other.annotate) == (True, False, True)
    assert other.event_count == 1  # a new reason is a new Event


def test_eviction_off_keeps_every_pod():
    tracker = RefusalTracker(EvictionPolicy(evict=False, repeats=1, delay_s=0))
    assert not any(tracker.refused(refusal(t), True).evict for t in range(5))


def test_the_event_names_the_container_and_counts():
    r = refusal(1795742228.5)
    tracker = RefusalTracker(EvictionPolicy())
    tracker.refused(r, True)
    body = event_body(r, tracker.refused(refusal(1795742230), True), now=1795742231)
    assert body["metadata"] == {"name": event_name(r), "namespace": "default"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                      "name": "web-1", "uid": "u1",
                                      "fieldPath": "spec.containers{work}"}
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "TopologyAffinityError", 2)
    assert body["source"] == {"component": "nri-numa", "host": "node-a"}
    assert (body["firstTimestamp"], body["lastTimestamp"]) == ("2026-11-27T01:17:08Z",
                                                            "2026-11-27T01:17:11Z")
    assert event_name(r) != event_name(refusal(0, uid="u2"))


def test_a_refusal_message_missing_a_field_is_refused_in_one_line():
    message = refusal_message("default", "p", "", "c", "R", "text", "n")
    with pytest.raises(ValueError, match="without uid"):
        Refusal.from_message(message)


def test_the_controller_is_the_owner_marked_controller():
    owned = {"metadata": {"ownerReferences": [
        {"kind": "Node", "name": "n"}, {"kind": "ReplicaSet", "name": "web-7f", "controller": True}]}}
    assert controller_of(owned) == "ReplicaSet/web-7f"
    assert controller_of({"metadata": {}}) is None


class FakeCore:
    """The calls PodActions makes of CoreV1Api, recorded; the pod it reads is ``pod``."""

    def __init__(self, pod: dict) -> None:
        self.pod = pod
        self.events: list[dict] = []
        self.pod_patches: list[dict] = []
        self.evictions: list[str] = []

    def read_namespaced_pod(self, name, namespace, **kwargs):
        return self.pod

    def create_namespaced_event(self, namespace, body, **kwargs):
        self.events.append(body)

    def patch_namespaced_event(self, name, namespace, body, **kwargs):
        self.events.append(body)

    def patch_namespaced_pod(self, name, namespace, body, **kwargs):
        self.pod_patches.append(body)

    def create_namespaced_pod_eviction(self, name, namespace, body, **kwargs):
        self.evictions.append(name)


class FakeApiClient:
    def sanitize_for_serialization(self, value):
        return value


def handlers_for(pod: dict, monkeypatch) -> tuple[dict, FakeCore]:
    import kubernetes.client

    core = FakeCore(pod)
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda api_client: core)
    handlers = message_handlers(FakeApiClient(), lambda message: None,
                                EvictionPolicy(evict=True, repeats=1, delay_s=0))
    handlers["refusal"].__self__._eviction_version = "policy/v1"  # no API group to ask
    return handlers, core


def test_a_degraded_container_gets_one_warning_event_and_never_an_eviction(monkeypatch):
    pod = {"metadata": {"uid": "u1", "ownerReferences": [
        {"kind": "ReplicaSet", "name": "web-7f", "controller": True}]}}
    handlers, core = handlers_for(pod, monkeypatch)
    message = degraded_message("default", "web-1", "u1", "work", "container work runs in the "
                               "shared pool without its exclusive CPUs", "node-a", at=10.0)
    for _ in range(3):  # the agent sends one per container; a repeat changes nothing more
        handlers["degraded"](message)
    assert [e["reason"] for e in core.events] == [DEGRADED_REASON] * 3
    first = core.events[0]
    assert (first["type"], first["count"]) == ("Warning", 1)
    assert first["message"].startswith("container work runs in the shared pool")
    assert first["involvedObject"]["fieldPath"] == "spec.containers{work}"
    assert {e["metadata"]["name"] for e in core.events} == {first["metadata"]["name"]}
    assert not core.evictions and not core.pod_patches
    # A refusal of the same pod is still its own Event, and still counts towards an eviction.
    handlers["refusal"](refusal_message("default", "web-1", "u1", "work", "TopologyAffinityError",
                                        "TopologyAffinityError: no room", "node-a", at=11.0))
    assert core.evictions == ["web-1"]


def test_no_event_for_a_degraded_container_whose_pod_is_gone(monkeypatch):
    handlers, core = handlers_for({"metadata": {"uid": "another"}}, monkeypatch)
    handlers["degraded"](degraded_message("default", "web-1", "u1", "work", "text", "node-a"))
    assert not core.events
