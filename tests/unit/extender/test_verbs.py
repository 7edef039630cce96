"""The extender's verbs: assumed pods, nodes without nri-numa, scores, bad requests (over the
real HTTP server on 127.0.0.1)."""

from __future__ import annotations

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


def test_two_pods_cannot_both_take_the_last_aligned_node():
    bound = []
    cache = NodeCache(assume_seconds=30)
    cache.observe("a", published())
    extender = Extender(cache, binder=lambda *args: bound.append(args))
    first, second = pod("first", "8"), pod("second", "8")
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
