"""What a refusal leads to: an Event every time (counted per reason), an annotation on a bare
pod, an eviction of a controller's pod after enough refusals and time, never twice."""

from __future__ import annotations

import pytest

from nri_numa.cluster.refusals import (EvictionPolicy, Refusal, RefusalTracker, controller_of,
                                       event_body, event_name, refusal_message)


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
