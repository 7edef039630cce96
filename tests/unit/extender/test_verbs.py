"""The extender's verbs: assumed pods, nodes without nri-numa, scores, bad requests (over the
real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import copy
import http.client
import json
import threading

import pytest

from nri_numa.cluster.node_state import ANNOTATION, encode
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.server import ExtenderServer
from nri_numa.extender.verbs import CHOSEN_NUMA_ANNOTATION, Extender, Packing
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic import MachineSpec, MemorySpec, build_topology

GIB = 1 << 30
# 2 NUMA nodes of 4 cores × 2 threads; CPU 0 reserved: 7 then 8 CPUs free.
MACHINE = build_topology(MachineSpec("x", sockets=2, nodes_per_socket=1, cores_per_node=4,
                                     memory=MemorySpec(8 * GIB)))
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
          "topologyManagerPolicy": "single-numa-node"}


def published(generation: int = 0, ledger: Ledger | None = None) -> dict:
    ledger = ledger or Ledger(EngineContext.build(MACHINE, config_from_mapping(CONFIG)))
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, generation)
    return {"metadata": {"name": "n", "annotations": {ANNOTATION: text}}}


def pod(name: str, cpu: str) -> dict:
    limits = {"cpu": cpu, "memory": "1Gi"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits,
                                                                   "requests": limits}}]}}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePods:
    """The API server's pods as bind reads and binds them."""

    def __init__(self, *manifests: dict) -> None:
        self.pods = {(m["metadata"]["namespace"], m["metadata"]["name"]): copy.deepcopy(m)
                     for m in manifests}
        self.bound: list[tuple] = []

    def read_pod(self, namespace, name):
        return copy.deepcopy(self.pods.get((namespace, name)))

    def bind(self, namespace, name, uid, node, annotations):
        self.bound.append((namespace, name, uid, node, dict(annotations)))
        self.pods[namespace, name]["spec"]["nodeName"] = node


def test_two_pods_cannot_both_take_the_last_aligned_node():
    cache = NodeCache(assume_seconds=30)
    cache.observe("a", published())
    first, second = pod("first", "8"), pod("second", "8")
    api = FakePods(first, second)
    bound = api.bound
    extender = Extender(cache, api)
    # Both filtered before either is bound: both fit on node 1 of "a".
    assert extender.filter({"Pod": first, "NodeNames": ["a"]})["NodeNames"] == ["a"]
    assert extender.filter({"Pod": second, "NodeNames": ["a"]})["NodeNames"] == ["a"]
    assert extender.bind({"PodNamespace": "ns", "PodName": "first", "PodUID": "uid-first",
                          "Node": "a"}) == {"Error": ""}
    assert bound[0][4] == {CHOSEN_NUMA_ANNOTATION: "1"}
    answer = extender.bind({"PodNamespace": "ns", "PodName": "second", "PodUID": "uid-second",
                            "Node": "a"})
    assert "no longer admits" in answer["Error"] and len(bound) == 1
    answer = extender.filter({"Pod": second, "NodeNames": ["a"]})
    assert answer["NodeNames"] == [] and "TopologyAffinityError" in answer["FailedNodes"]["a"]


def test_an_assumed_pod_is_released_by_the_timeout_or_the_publication_that_shows_it():
    clock = Clock()
    cache = NodeCache(assume_seconds=30, clock=clock)
    cache.observe("a", published())
    extender = Extender(cache)
    extender.filter({"Pod": pod("p", "8"), "NodeNames": ["a"]})
    extender.bind({"PodNamespace": "ns", "PodName": "p", "PodUID": "uid-p", "Node": "a"})
    assert "uid-p" in cache.entry("a").working.pods
    clock.now = 31
    assert "uid-p" not in cache.entry("a").working.pods
    # Shown by the node: no longer assumed, counted once.
    clock.now = 40
    extender.filter({"Pod": pod("p", "8"), "NodeNames": ["a"]})
    extender.bind({"PodNamespace": "ns", "PodName": "p", "PodUID": "uid-p", "Node": "a"})
    ledger = Ledger(EngineContext.build(MACHINE, config_from_mapping(CONFIG)))
    from nri_numa.engine.manifest import pod_from_manifest
    assert ledger.admit(pod_from_manifest(pod("p", "8"))).decision.admitted
    cache.observe("a", published(1, ledger))
    assert cache.entry("a").assumed == ()
    assert set(cache.entry("a").working.pods) == {"uid-p"}


def test_nodes_without_nri_numa_pass_and_unreadable_states_are_refused_with_the_reason():
    cache = NodeCache()
    cache.observe("a", published())
    cache.observe("broken", {"metadata": {"annotations": {ANNOTATION: "v1:@@"}}})
    extender = Extender(cache)
    answer = extender.filter({"Pod": pod("p", "16"), "NodeNames": ["plain", "a", "broken"]})
    assert answer["NodeNames"] == ["plain"]
    assert "not base64" in answer["FailedNodes"]["broken"]
    assert "TopologyAffinityError" in answer["FailedNodes"]["a"]


@pytest.mark.parametrize(("packing", "emptier_wins"), [(Packing.LEAST_ALLOCATED, True),
                                                       (Packing.MOST_ALLOCATED, False)])
def test_prioritize_prefers_one_numa_node_then_the_configured_packing(packing, emptier_wins):
    cache = NodeCache()
    ledger = Ledger(EngineContext.build(MACHINE, config_from_mapping(CONFIG)))
    from nri_numa.engine.manifest import pod_from_manifest
    ledger.admit(pod_from_manifest(pod("busy", "6")))
    cache.observe("empty", published())
    cache.observe("busy", published(1, ledger))
    scores = {h["Host"]: h["Score"] for h in Extender(cache, packing=packing).prioritize(
        {"Pod": pod("p", "2"), "NodeNames": ["empty", "busy", "plain"]})}
    assert scores["plain"] == 0
    assert (scores["empty"] > scores["busy"]) == emptier_wins


@pytest.fixture
def server():
    cache = NodeCache()
    cache.observe("a", published())
    server = ExtenderServer(("127.0.0.1", 0), Extender(cache), prefix="/x")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("path", "body", "status", "expected"), [
    ("/x/filter", b"{not json", 400, "not JSON"),
    ("/x/filter", b"[" * 5000 + b"]" * 5000, 400, "nested deeper"),
    ("/x/nope", b"{}", 404, "no verb"),
    ("/x/filter", json.dumps({"Pod": {"spec": {}}, "NodeNames": ["a"]}).encode(), 200,
     "Pod: metadata"),
    ("/x/filter", json.dumps({"Pod": pod("p", "1"), "NodeNames": "a"}).encode(), 200,
     "NodeNames must be a list"),
    ("/x/bind", b"{}", 200, "must be names"),
])
def test_bad_requests_get_one_line(server, path, body, status, expected):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    answer = conn.getresponse()
    text = answer.read().decode()
    assert answer.status == status and expected in text
    if status == 200:
        assert "\n" not in json.loads(text)["Error"]
    # The connection still serves the next request.
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok"


def bind_args(name: str, node: str = "a", uid: str | None = None) -> dict:
    return {"PodNamespace": "ns", "PodName": name, "PodUID": uid or f"uid-{name}", "Node": node}


def changed(manifest: dict, change) -> dict:
    manifest = copy.deepcopy(manifest)
    change(manifest)
    return manifest


@pytest.mark.parametrize(("live", "expected"), [
    (None, "does not exist"),
    (lambda m: m["metadata"].update(uid="uid-other"), "is now another pod"),
    (lambda m: m["spec"].update(nodeName="b"), "is already bound to b"),
    (lambda m: m.update(status={"phase": "Running"}), "is not Pending (Running)"),
    (lambda m: m["metadata"].update(deletionTimestamp="2026-11-29T07:00:00Z"), "(deleting)"),
    (lambda m: m["spec"].update(schedulerName="other"), "for scheduler other"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(
        limits={"cpu": "1", "memory": "1Gi"}, requests={"cpu": "1", "memory": "1Gi"}),
     "differs from the pod its filter judged"),
])
def test_bind_refuses_a_pod_the_api_server_shows_otherwise(live, expected, caplog):
    cache = NodeCache()
    cache.observe("a", published())
    manifest = pod("p", "8")
    api = FakePods(*([] if live is None else [changed(manifest, live)]))
    extender = Extender(cache, api)
    assert extender.filter({"Pod": manifest, "NodeNames": ["a"]})["NodeNames"] == ["a"]
    answer = extender.bind(bind_args("p"))
    assert answer["Error"].startswith("nri-numa: bind refused: pod ns/p (uid-p)")
    assert expected in answer["Error"] and "\n" not in answer["Error"]
    assert api.bound == [] and "uid-p" not in cache.entry("a").working.pods
    assert any("bind refused" in r.getMessage() for r in caplog.records)


def test_bind_binds_only_what_its_filter_judged_and_only_once():
    clock = Clock()
    cache = NodeCache(assume_seconds=30, clock=clock)
    cache.observe("a", published())
    victim, seen = pod("victim", "2"), pod("seen", "2")
    api = FakePods(victim, seen)
    extender = Extender(cache, api)
    # Never filtered: refused, whatever the node.
    assert "was not filtered by this extender" in extender.bind(bind_args("victim"))["Error"]
    # Filtered, but the node named was not one its filter kept.
    extender.filter({"Pod": seen, "NodeNames": ["a"]})
    assert "node b was not kept by the filter" in extender.bind(bind_args("seen", "b"))["Error"]
    # Another pod's name with the filtered pod's uid.
    assert "was not filtered" in extender.bind(bind_args("victim", uid="uid-seen"))["Error"]
    # Filtered too long ago.
    clock.now = 31
    assert "filtered 31 s ago" in extender.bind(bind_args("seen"))["Error"]
    # Filtered again: bound once; the same bind again is refused (nothing to replay).
    extender.filter({"Pod": seen, "NodeNames": ["a"]})
    assert extender.bind(bind_args("seen")) == {"Error": ""}
    assert [b[:4] for b in api.bound] == [("ns", "seen", "uid-seen", "a")]
    assert "was not filtered" in extender.bind(bind_args("seen"))["Error"]
    assert len(api.bound) == 1


def test_bind_honours_the_configured_scheduler_name():
    cache = NodeCache()
    cache.observe("a", published())
    mine = changed(pod("p", "2"), lambda m: m["spec"].update(schedulerName="numa-scheduler"))
    for scheduler, bound in (("default-scheduler", 0), ("numa-scheduler", 1)):
        api = FakePods(mine)
        extender = Extender(cache, api, scheduler_name=scheduler)
        extender.filter({"Pod": mine, "NodeNames": ["plain"]})
        extender.bind(bind_args("p", "plain"))
        assert len(api.bound) == bound


def test_filter_remembers_refusals_per_node_until_taken():
    cache = NodeCache()
    cache.observe("a", published())
    cache.observe("b", published())
    extender = Extender(cache)
    big, small = pod("big", "16"), pod("small", "1")
    extender.filter({"Pod": big, "NodeNames": ["a", "b", "plain"]})
    extender.filter({"Pod": small, "NodeNames": ["a", "b"]})
    assert [p.uid for p in extender.take_refused("a")] == ["uid-big"]
    assert extender.take_refused("a") == []  # taken once
    # Kept on b by a later filter: no longer refused there.
    extender.filter({"Pod": pod("big", "1"), "NodeNames": ["b"]})
    assert extender.take_refused("b") == []
    assert extender.take_refused("plain") == []


def test_a_publication_that_frees_room_is_told_once():
    told = []
    cache = NodeCache(on_room=lambda node, generation: told.append((node, generation)))
    ledger = Ledger(EngineContext.build(MACHINE, config_from_mapping(CONFIG)))
    from nri_numa.engine.manifest import pod_from_manifest
    cache.observe("a", published(0, ledger))  # first seen: nothing freed
    ledger.admit(pod_from_manifest(pod("p", "4")))
    cache.observe("a", published(1, ledger))  # taken, not freed
    cache.observe("a", published(1, ledger))  # the same publication again
    assert told == []
    ledger.release("uid-p")
    cache.observe("a", published(2, ledger))
    cache.observe("a", published(2, ledger))
    assert told == [("a", 2)]


def test_the_retry_annotation_is_accepted_and_changes_no_shape():
    from nri_numa.engine.annotations import RETRY_FOR_ROOM
    from nri_numa.engine.manifest import pod_from_manifest
    from nri_numa.extender.shapes import pod_shape

    cache = NodeCache()
    cache.observe("a", published())
    marked = changed(pod("p", "2"), lambda m: m["metadata"].update(
        annotations={RETRY_FOR_ROOM: "a@7"}))
    assert Extender(cache).filter({"Pod": marked, "NodeNames": ["a"]})["NodeNames"] == ["a"]
    assert pod_shape(pod_from_manifest(marked)) == pod_shape(pod_from_manifest(pod("p", "2")))
