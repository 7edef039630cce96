"""The checkpoint's payload encoded again only where it changed (nri_numa.state.encoding): byte
for byte what encoding the whole value gives, through runs of changes, and loaded back as the
same ledger and records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.state import encoding
from nri_numa.state.checkpoint import CheckpointStore
from nri_numa.state.encoding import Encoded, LedgerEncoder, RecordsEncoder, encode_payload
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import (ContainerRecord, PodRecord, records_from_dict,
                                           records_to_dict)
from nri_numa.topology.synthetic import preset_topology
from tests.tmpfs import fast_tmp

ODD = ("", "é", "\x00", 'quo"te', "back\\slash", "line\nbreak", "numa.nri.io/topology-policy")


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def random_records(rng: random.Random, n: int) -> tuple[dict[str, PodRecord],
                                                         dict[str, ContainerRecord]]:
    made = [PodRecord(f"sb{rng.random()}{rng.choice(ODD)}", f"uid-{i}", rng.choice(ODD),
                      f"pod{i}", rng.choice(["", "/kubepods/pod1", "/kubepods/besteffort/pod2"]),
                      {rng.choice(ODD): rng.choice(ODD) for _ in range(rng.randint(0, 3))})
            for i in range(n)]
    pods = {p.sandbox_id: p for p in made}
    containers = {}
    for i in range(2 * n):
        pages = {2048: 1 << 21} if rng.random() < 0.3 else {}  # requests are the limits
        request = ContainerRequest(
            f"c{i}{rng.choice(ODD)}", cpu_request=rng.choice([0, 250, 2000]),
            memory_limit=rng.choice([0, 1 << 30]), hugepages_requests=pages,
            hugepages_limits=pages,
            device_numa_hints={"nvidia.com/gpu": frozenset({1, 0})} if rng.random() < 0.3 else {})
        cid = f"id{rng.random()}"
        containers[cid] = ContainerRecord(
            cid, rng.choice(list(pods)), f"uid-{i}", request,
            frozenset(rng.sample(range(64), rng.randint(1, 6))), rng.random() < 0.5,
            rng.choice([None, frozenset({0}), frozenset({0, 1})]), rng.random() < 0.8)
    return pods, containers


def moved(record: ContainerRecord, cpus: frozenset[int]) -> ContainerRecord:
    """What the plugin does to a shared container when the pool changes: a new record, the
    same request."""
    return ContainerRecord(record.id, record.sandbox_id, record.pod_uid, record.request, cpus,
                           record.exclusive, record.mems, record.in_ledger)


def on_pool(containers: dict[str, ContainerRecord], pool: frozenset[int]
            ) -> dict[str, ContainerRecord]:
    """The records as the checkpoint shows them: a shared container on the pool."""
    return {k: c if c.exclusive else moved(c, pool) for k, c in containers.items()}


@pytest.mark.parametrize("seed", range(5))
def test_encoding_equals_the_whole_encoding_through_a_run_of_changes(seed: int) -> None:
    rng = random.Random(seed)
    pods, containers = random_records(rng, 12)
    encoder = RecordsEncoder()
    pool = frozenset({3, 4})
    for step in range(30):
        assert encoder.encode(pods, containers, pool) == canonical(
            records_to_dict(pods, on_pool(containers, pool)))
        action = step % 3
        if action == 0:  # the pool changed: the shared records stay as they are
            pool = frozenset(rng.sample(range(64), 8))
        elif action == 1 and containers:  # a container went, and maybe its pod
            gone = rng.choice(list(containers))
            containers = {k: c for k, c in containers.items() if k != gone}
        else:  # a new container and pod
            more_pods, more = random_records(rng, 1)
            pods.update(more_pods)
            containers.update(more)


def test_unchanged_records_are_not_encoded_again(monkeypatch) -> None:
    pods, containers = random_records(random.Random(1), 4)
    encoder = RecordsEncoder()
    encoder.encode(pods, containers, frozenset({5}))
    calls = []
    real = encoding.canonical
    monkeypatch.setattr(encoding, "canonical", lambda value: calls.append(value) or real(value))
    encoder.encode(pods, containers, frozenset({5}))
    assert calls == []
    encoded = encoder.encode(pods, containers, frozenset({9}))
    assert calls == []  # a new pool is written into the shared records' cached rest
    assert encoded == canonical(records_to_dict(pods, on_pool(containers, frozenset({9}))))


def engine() -> EngineContext:
    return EngineContext.build(preset_topology("intel-2s-ht"), config_from_mapping({
        "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,1",
        "topologyManagerPolicy": "best-effort", "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}))


def pod(rng: random.Random, uid: str) -> PodRequest:
    cpus = rng.choice(["2", "4", "500m", "0"])
    limits = {"cpu": cpus, "memory": "1Gi"} if cpus != "0" else {}
    main = container_from_resources("main", "app", {}, limits)
    return PodRequest(uid=uid, namespace="default", name=uid, app_containers=(main,))


@pytest.mark.parametrize("seed", range(3))
def test_ledger_encoding_equals_the_whole_encoding_through_admissions_and_releases(seed):
    rng = random.Random(seed)
    ledger, encoder = Ledger(engine()), LedgerEncoder()
    admitted: list[str] = []
    for step in range(60):
        assert encoder.encode(ledger) == canonical(ledger.to_dict()), step
        if admitted and rng.random() < 0.4:
            ledger.release(admitted.pop(rng.randrange(len(admitted))))
        else:
            uid = f"pod-{step}-{rng.choice(['', 'é', 'z'])}"
            if ledger.admit(pod(rng, uid)).decision.admitted:
                admitted.append(uid)
    assert len(admitted) > 5


def test_a_checkpoint_with_encoded_members_loads_back(tmp_path: Path) -> None:
    pods, containers = random_records(random.Random(2), 5)
    ledger = Ledger(engine())
    ledger.admit(pod(random.Random(3), "a"))
    with fast_tmp(tmp_path) as base:
        store = CheckpointStore(base / "state", "m" * 64)
        store.save({"ledger": LedgerEncoder().encode(ledger),
                    "records": RecordsEncoder().encode(pods, containers, frozenset({7}))})
        payload = store.load()
    assert payload is not None
    assert records_from_dict(payload["records"]) == (pods, on_pool(containers, frozenset({7})))
    assert Ledger.restore(ledger.ctx, payload["ledger"]).allocations == ledger.allocations


def test_payload_encoding_takes_encoded_members_as_they_are() -> None:
    payload = {"b": [1, "é"], "a": {"y": 1, "x": None}}
    assert encode_payload(payload) == canonical(payload)
    assert encode_payload({**payload, "c": Encoded(b'{"z":1}')}) == canonical(
        {**payload, "c": {"z": 1}})
