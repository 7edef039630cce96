"""Pod shapes (nri_numa.extender.shapes) and the verdicts the extender shares between replicas:
a replica gets the decision a fresh admission would give it, until the node's working
allocations change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nri_numa.engine.admit import admit
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.extender import verbs
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.shapes import pod_shape
from nri_numa.extender.verbs import Extender
from tests.unit.extender.test_verbs import published


def manifest(name: str, cpu: str = "2", memory: str = "1Gi", annotations=None,
             container: str = "main") -> dict:
    limits = {"cpu": cpu, "memory": memory}
    return {"metadata": {"name": name, "namespace": f"ns-{name}", "uid": f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [{"name": container, "resources": {"limits": limits,
                                                                      "requests": limits}}]}}


def shape(**kwargs) -> object:
    return pod_shape(pod_from_manifest(manifest(kwargs.pop("name", "p"), **kwargs)))


def test_replicas_share_a_shape_and_anything_the_engine_reads_tells_shapes_apart():
    base = shape()
    assert shape(name="other", annotations={"app": "web", "pod-template-hash": "x"}) == base
    hash(base)
    for different in (shape(cpu="3"), shape(memory="2Gi"), shape(container="side"),
                      shape(annotations={"numa.nri.io/topology-scope": "pod"}),
                      shape(annotations={"numa.nri.io/isolated-cpus": "prefer"})):
        assert different != base
    pod = pod_from_manifest(manifest("p"))
    assert pod_shape(replace(pod, preferred_numa={1})) != base
    assert pod_shape(replace(pod, qos_override="Burstable")) != base


@pytest.fixture
def counted(monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[2].uid)
        return admit(*args, **kwargs)

    monkeypatch.setattr(verbs, "admit", counting)
    return calls


def test_a_replica_gets_a_fresh_admissions_answer_without_one(counted):
    cache = NodeCache(assume_seconds=3600)
    cache.observe("a", published())
    extender = Extender(cache)
    for name in ("r1", "r2", "r3"):
        answer = extender.filter({"Pod": manifest(name, cpu="4"), "NodeNames": ["a"]})
        assert answer["NodeNames"] == ["a"]
        entry = cache.entry("a")
        fresh = admit(entry.ctx, entry.working, pod_from_manifest(manifest(name, cpu="4")))
        assert extender.verdict("a", pod_from_manifest(manifest(name, cpu="4"))).decision \
            == fresh.decision  # its own uid, the same placement
    assert counted == ["uid-r1"]  # one admission for three replicas, filter and verdict
    # Bound: the node's working allocations change (r1 holds 4 CPUs there now), so the next
    # replica is admitted anew, on what is left.
    assert extender.bind({"PodNamespace": "ns-r1", "PodName": "r1", "PodUID": "uid-r1",
                          "Node": "a"}) == {"Error": ""}
    entry = cache.entry("a")
    after = extender.verdict("a", pod_from_manifest(manifest("r2", cpu="4"))).decision
    assert counted[-1] == "uid-r2" and len(counted) == 2
    assert after == admit(entry.ctx, entry.working,
                          pod_from_manifest(manifest("r2", cpu="4"))).decision
    # A refusal is shared too, with its message.
    big = [extender.filter({"Pod": manifest(n, cpu="9"), "NodeNames": ["a"]})
           for n in ("b1", "b2")]
    assert big[0]["FailedNodes"] == big[1]["FailedNodes"] and big[0]["FailedNodes"]["a"]
    assert counted[-1] == "uid-b1" and len(counted) == 3
