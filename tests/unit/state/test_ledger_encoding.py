"""The ledger's incremental encoding (nri_numa.state.encoding.LedgerEncoder) on the memory
state's every part: many NUMA nodes (their keys sort as text: "10" before "2"), memory blocks
coming and going, and the memory init containers leave for later containers to reuse."""

from __future__ import annotations

import json
import random

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import PodRequest
from nri_numa.state import encoding
from nri_numa.state.encoding import LedgerEncoder
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic import preset_topology


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def many_nodes() -> EngineContext:
    return EngineContext.build(preset_topology("numa64-1024"), config_from_mapping({
        "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,1",
        "topologyManagerPolicy": "best-effort", "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}))


def pod_with_init(uid: str, rng: random.Random) -> PodRequest:
    init = container_from_resources("init", "init", {}, {"cpu": "2", "memory": "3Gi"})
    main = container_from_resources("main", "app", {}, {
        "cpu": rng.choice(["1", "2"]), "memory": rng.choice(["1Gi", "4Gi"])})
    return PodRequest(uid=uid, namespace="default", name=uid, init_containers=(init,),
                      app_containers=(main,))


def test_ledger_encoding_follows_memory_blocks_and_reusable_memory_on_64_nodes():
    rng = random.Random(4)
    ledger, encoder = Ledger(many_nodes()), LedgerEncoder()
    waiting: dict[str, PodRequest] = {}  # init container placed, app container not yet
    running: list[str] = []
    seen_reusable = seen_two_digit_node = False
    for step in range(60):
        assert encoder.encode(ledger) == canonical(ledger.to_dict()), step
        memory = ledger.allocations.memory
        seen_reusable |= bool(memory.reusable)
        seen_two_digit_node |= any(b.numa_affinity[0] >= 10 for pod in memory.blocks.values()
                                   for blocks in pod.values() for b in blocks)
        action = rng.random()
        if waiting and action < 0.35:
            uid, pod = waiting.popitem()
            if ledger.admit(pod, ["main"]).decision.admitted:
                running.append(uid)
        elif running and action < 0.6:
            ledger.release(running.pop(rng.randrange(len(running))))
        else:
            uid = f"pod-{step}"
            pod = pod_with_init(uid, rng)
            if ledger.admit(pod, ["init"]).decision.admitted:
                waiting[uid] = pod
    assert encoder.encode(ledger) == canonical(ledger.to_dict())
    assert seen_reusable and running
    assert len(ledger.allocations.memory.nodes) == 64
    assert seen_two_digit_node or len(running) + len(waiting) < 10


def test_an_unchanged_ledger_is_not_encoded_again_and_a_new_pod_alone_is(monkeypatch):
    ledger, encoder = Ledger(many_nodes()), LedgerEncoder()
    rng = random.Random(1)
    ledger.admit(pod_with_init("a", rng), ["init"])
    encoder.encode(ledger)
    calls: list[object] = []
    real = encoding.canonical
    monkeypatch.setattr(encoding, "canonical", lambda value: calls.append(value) or real(value))
    encoder.encode(ledger)
    assert calls == []
    shared = container_from_resources("main", "app", {"cpu": "100m"}, {})
    ledger.admit(PodRequest(uid="b", namespace="default", name="b", app_containers=(shared,)))
    assert encoder.encode(ledger) == real(ledger.to_dict())
    assert calls[0] == "b" and len(calls) == 2  # pod b's key and value; the memory is as it was
