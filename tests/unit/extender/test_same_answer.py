"""Same answer, proven (issue 13 item 4): a node's published state replayed through the
extender gives, for every generated pod, the decision the node's own admission makes. The node
is given the NUMA nodes the extender chose (``preferred_numa``, as the node reads them from
numa.nri.io/scheduled-numa-nodes) and places every admitted pod inside them (item 3).

The node side is a Ledger on the node's own objects; the extender side only ever sees the
annotation text the node publishes after each admission. A sample of the pods goes through the
real HTTP server on 127.0.0.1 as kube-scheduler would send it.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.request
from dataclasses import replace

import pytest

from nri_numa.cluster.node_state import ANNOTATION, encode
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import PreferredNuma
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.server import ExtenderServer
from nri_numa.extender.verbs import Extender, numa_nodes_of
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic.presets import preset_topology

NODES = {
    "dgx": ("dgx-h100", {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
                         "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,112",
                         "cpuManagerPolicyOptions": {"full-pcpus-only": "true"}}),
    "epyc": ("amd-epyc-2s-nps4", {"topologyManagerPolicy": "restricted",
                                  "cpuManagerPolicy": "static", "memoryManagerPolicy": "Static",
                                  "kubeReserved": {"cpu": "2", "memory": "1Gi"},
                                  "reservedMemory": [{"numaNode": 0,
                                                      "limits": {"memory": "1Gi"}}]}),
    "gb200": ("gb200", {"topologyManagerPolicy": "best-effort", "cpuManagerPolicy": "static",
                        "reservedSystemCPUs": "0"}),
}
PODS_PER_NODE = 700  # 2100 pods in all
HTTP_EVERY = 25  # one pod in this many also goes through the HTTP server


def manifest(rng: random.Random, i: int, gpus: bool) -> dict:
    def container(name: str) -> dict:
        cpu = rng.choice(["1", "2", "3", "4", "8", "16", "24", "500m", "1500m"])
        memory = rng.choice(["256Mi", "1Gi", "4Gi", "16Gi", "64Gi"])
        limits = {"cpu": cpu, "memory": memory}
        if gpus and rng.random() < 0.3:
            limits["nvidia.com/gpu"] = str(rng.choice([1, 1, 2, 4, 8]))
        qos = rng.random()
        if qos < 0.7:  # Guaranteed
            resources = {"limits": limits, "requests": dict(limits)}
        elif qos < 0.9:  # Burstable
            resources = {"requests": {"cpu": "250m", "memory": "128Mi"}}
        else:
            resources = {}
        return {"name": name, "image": "x", "resources": resources}

    spec = {"containers": [container(f"c{k}") for k in range(rng.choice([1, 1, 1, 2, 3]))]}
    if rng.random() < 0.2:
        spec["initContainers"] = [container("init")]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": f"p{i}", "namespace": "gen", "uid": f"uid-{i:05d}"}}


def nrt(ledger: Ledger, generation: int) -> dict:
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, generation)
    return {"metadata": {"annotations": {ANNOTATION: text}}}


@pytest.fixture
def served():
    cache = NodeCache(assume_seconds=3600)
    extender = Extender(cache)
    server = ExtenderServer(("127.0.0.1", 0), extender, prefix="/nri-numa")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield extender, f"http://127.0.0.1:{server.server_address[1]}/nri-numa"
    server.shutdown()
    server.server_close()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("node", sorted(NODES))
def test_every_extender_verdict_equals_the_nodes_admission(node, served):
    extender, url = served
    preset, config = NODES[node]
    ledger = Ledger(EngineContext.build(preset_topology(preset), config_from_mapping(config)))
    rng = random.Random(f"same-answer-{node}")
    extender.cache.observe(node, nrt(ledger, 0))
    admitted = refused = honoured = 0
    for i in range(PODS_PER_NODE):
        obj = manifest(rng, i, gpus="nvidia.com/gpu" in ledger.ctx.devices)
        predicted = extender.verdict(node, pod_from_manifest(obj)).decision
        if i % HTTP_EVERY == 0:
            answer = post(f"{url}/filter", {"Pod": obj, "NodeNames": [node]})
            assert (answer["NodeNames"] == [node]) == predicted.admitted
            if not predicted.admitted:
                assert answer["FailedNodes"][node] == f"nri-numa: {predicted.rejection.message}"
        pod = pod_from_manifest(obj)
        chosen = numa_nodes_of(predicted) if predicted.admitted else frozenset()
        actual = ledger.admit(replace(pod, preferred_numa=chosen) if chosen else pod).decision
        if chosen:
            assert actual.preferred_numa == PreferredNuma(chosen, True), f"pod {i} on {node}"
            assert all(p.hint.affinity is None or p.hint.affinity <= chosen
                       for p in actual.placements)
            honoured += 1
        assert predicted.to_dict() == replace(actual, preferred_numa=None).to_dict(), \
            f"pod {i} on {node}"
        admitted += actual.admitted
        refused += not actual.admitted
        if actual.admitted:
            extender.cache.observe(node, nrt(ledger, i + 1))
        if rng.random() < 0.35 and ledger.allocations.pods:  # pods leave, as on a real node
            ledger.release(rng.choice(sorted(ledger.allocations.pods)))
            extender.cache.observe(node, nrt(ledger, i + 1))
    assert admitted > 100 and refused > 20  # both answers were exercised
    assert honoured > 50  # and the chosen NUMA nodes were given on many of them
