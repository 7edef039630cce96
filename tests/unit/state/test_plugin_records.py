"""The plugin's records (nri_numa.state.plugin_records) on their own: shared-pool moves, orphans,
the tables' notes for the journal and their exact undo on a refusal, the indexes following every
change, and their JSON in a checkpoint with each bad field named; and the decision lines
(nri_numa.nri.decision_log), whose fields are not built for a line nobody writes."""

from __future__ import annotations

import json
import logging
import random

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.nri import decision_log
from nri_numa.nri.translate import shared_updates
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import (ContainerRecord, ContainerTable, PodRecord,
                                           RecordError, Records, TrackedDict, records_from_dict,
                                           records_to_dict)
from nri_numa.topology.cpulist import format_list
from tests.integration.nri.plugin_env import CONFIG, machine


def records() -> Records:
    return Records(Ledger(EngineContext.build(machine(), config_from_mapping(CONFIG))))


def place(r: Records, uid: str, cpu: str) -> ContainerRecord:
    """A one-container pod admitted and recorded, as the plugin does; ``cpu`` "2" is
    exclusive, "100m" shared."""
    pod = r.pod(PodRecord(f"sb-{uid}", uid, "default", uid))
    limits = {"cpu": cpu, "memory": "1Gi"} if "m" not in cpu else {}
    request = container_from_resources("app", "app", {"cpu": cpu}, limits)
    result = r.ledger.admit(PodRequest(uid=uid, namespace="default", name=uid,
                                       app_containers=(request,)), ["app"])
    assert result.decision.admitted
    r.remember(f"ctr-{uid}", pod, request, result.decision.placements[0])
    return r.containers[f"ctr-{uid}"]


def test_shared_updates_move_each_shared_container_with_its_own_id():
    r = records()
    first = place(r, "a", "100m")
    second = place(r, "b", "100m")
    place(r, "c", "100m")
    place(r, "g", "2")  # the shared pool shrinks: a, b and c are not on it any more
    updates = shared_updates(r, skip="ctr-b")
    assert [u.container_id for u in updates] == ["ctr-a", "ctr-c"]
    assert {u.linux.resources.cpu.cpus for u in updates} == {format_list(r.shared)}
    assert all(not u.linux.resources.cpu.mems and u.ignore_failure for u in updates)
    # The records are not rewritten: a shared container's CPUs are the pool's.
    assert r.containers["ctr-a"] is first and r.cpus_of(first) == r.shared
    assert r.containers["ctr-b"] is second  # skipped: the caller gives it the pool itself
    assert r.containers["ctr-g"].exclusive and r.containers["ctr-g"].cpus.isdisjoint(r.shared)
    assert shared_updates(r, skip="ctr-b") == []  # everyone is where the pool is


def test_release_drops_empty_pods_and_ledger_entries_no_record_explains():
    r = records()
    place(r, "a", "2")
    place(r, "b", "100m")
    # A ledger entry without a record (as a checkpoint from an older agent could hold).
    orphan = container_from_resources("lost", "app", {"cpu": "1"}, {"cpu": "1", "memory": "1Gi"})
    assert r.ledger.admit(PodRequest(uid="x", namespace="default", name="x",
                                     app_containers=(orphan,))).decision.admitted
    released = r.release(["ctr-a", "ctr-unknown"])
    assert [c.id for c in released] == ["ctr-a"]
    assert list(r.pods) == ["sb-b"]
    # A release looks at its own pods only (its cost does not grow with the ledger) ...
    assert set(r.ledger.allocations.pods) == {"b", "x"}
    r.drop_orphans()  # ... the whole sweep runs on a restored checkpoint and at Synchronize
    assert set(r.ledger.allocations.pods) == {"b"}


def test_a_release_drops_the_orphans_of_its_own_pod():
    r = records()
    place(r, "a", "2")
    # The same pod's ledger holds a container no record explains.
    lost = container_from_resources("lost", "app", {"cpu": "1"}, {"cpu": "1", "memory": "1Gi"})
    app = r.containers["ctr-a"].request
    assert r.ledger.admit(PodRequest(uid="a", namespace="default", name="a",
                                     app_containers=(app, lost)), ["lost"]).decision.admitted
    r.remember("ctr-a2", r.pods["sb-a"], container_from_resources(
        "other", "app", {"cpu": "100m"}, {}), Placement("other", r.shared, False, None))
    r.release(["ctr-a"])
    assert not r.ledger.allocations.pod("a").containers  # "lost" went with its pod's release
    assert r.in_sandbox("sb-a") == ["ctr-a2"] and list(r.pods) == ["sb-a"]


def test_an_unchanged_pod_keeps_its_record_object():
    r = records()
    first = r.pod(PodRecord("sb", "uid", "ns", "p", annotations={"k": "v"}))
    assert r.pod(PodRecord("sb", "uid", "ns", "p", annotations={"k": "v"})) is first
    changed = r.pod(PodRecord("sb", "uid", "ns", "p", annotations={"k": "w"}))
    assert changed is not first and r.pods["sb"] is changed


def test_a_snapshot_rolls_everything_back():
    r = records()
    place(r, "a", "2")
    saved = r.snapshot()
    before = r.ledger.allocations
    place(r, "b", "2")
    r.roll_back(saved)
    assert r.ledger.allocations is before and list(r.containers) == ["ctr-a"]
    assert list(r.pods) == ["sb-a"]


def test_decision_fields_are_not_built_when_info_is_off(monkeypatch, caplog):
    r = records()
    record = place(r, "a", "2")
    pod = r.pods["sb-a"]
    built = []
    monkeypatch.setattr(decision_log, "decision_fields",
                        lambda *a: built.append(a) or {"hint": None, "preferred": False,
                                                       "cpus": "", "mems": None,
                                                       "devices": {}})
    placement = _placement(record)
    with caplog.at_level(logging.WARNING, logger="nri_numa.nri.plugin"):
        decision_log.placed(pod, "none", placement, record.id)
        decision_log.refused(pod, "app", record.id, None, "RequestError", None, "bad")
    assert built == [] and caplog.records == []
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        decision_log.placed(pod, "none", placement, record.id)
    assert len(built) == 1 and caplog.records[0].getMessage().startswith(
        "placed pod default/a container app: policy none")


def _placement(record: ContainerRecord) -> Placement:
    return Placement(record.name, record.cpus, record.exclusive, record.mems)


def record(cid: str, sandbox: str, exclusive: bool = False,
           in_ledger: bool = True) -> ContainerRecord:
    return ContainerRecord(cid, sandbox, f"uid-{sandbox}", ContainerRequest(cid[:1] or "x"),
                           frozenset({1}) if exclusive else frozenset(), exclusive,
                           in_ledger=in_ledger or exclusive)


def test_changes_are_noted_in_the_order_they_leave_the_table() -> None:
    t = TrackedDict({"a": 1, "b": 2})
    t["b"] = 3
    t["c"] = 4
    del t["a"]
    t["a"] = 5  # deleted and added again: at the end, and noted as deleted first
    assert list(t) == ["b", "c", "a"]
    assert t.changed == {"b": False, "c": False, "a": True}
    with pytest.raises(TypeError):
        t.update({"d": 1})


@pytest.mark.parametrize("seed", range(20))
def test_a_roll_back_restores_table_order_indexes_and_pending_changes(seed: int) -> None:
    rng = random.Random(seed)
    table = ContainerTable({f"c{i}": record(f"c{i}", f"s{i % 3}", i % 2 == 0) for i in range(8)})
    table["c1"] = record("c1", "s1", True)
    before = (dict(table), list(table), dict(table.changed))
    undo = table.begin()
    for _ in range(rng.randint(1, 6)):
        key = f"c{rng.randrange(12)}"
        if key in table and rng.random() < 0.4:
            del table[key]
        else:
            table[key] = record(key, f"s{rng.randrange(4)}", rng.random() < 0.5,
                                in_ledger=rng.random() < 0.5)
    table.roll_back(undo)
    assert dict(table) == before[0] and list(table) == before[1] and table.changed == before[2]
    fresh = ContainerTable(dict(table))
    assert table.by_sandbox == fresh.by_sandbox and table.by_uid == fresh.by_uid
    assert list(table.shared_ids) == list(fresh.shared_ids)
    assert list(table.unplaced_ids) == list(fresh.unplaced_ids)


def test_the_unplaced_index_follows_a_container_placed_in_place() -> None:
    table = ContainerTable({"a": record("a", "s", in_ledger=False), "b": record("b", "s")})
    assert list(table.unplaced_ids) == ["a"]
    table["a"] = record("a", "s")  # placed (promoted): same pod, still shared, now admitted
    assert not table.unplaced_ids and [r.id for r in table.of_sandbox("s")] == ["a", "b"]
    undo = table.begin()
    table["b"] = record("b", "s", in_ledger=False)
    del table["a"]
    table.roll_back(undo)
    assert not table.unplaced_ids


def test_an_updated_record_keeps_its_place_in_its_pod() -> None:
    table = ContainerTable({"a": record("a", "s"), "b": record("b", "s")})
    table["a"] = record("a", "s")  # a resize: the same container, a new record
    assert [r.id for r in table.of_sandbox("s")] == ["a", "b"]
    table["a"] = record("a", "s", exclusive=True)
    assert list(table.shared_ids) == ["b"]


# --- the records as a checkpoint holds them --------------------------------------------------


def _records():
    pods = {"sb1": PodRecord("sb1", "uid-1", "shop", "web", "/kubepods/pod-uid-1",
                             {"numa.nri.io/topology-scope": "pod"})}
    request = ContainerRequest("app", cpu_request=2000, cpu_limit=2000, memory_request=1 << 30,
                               memory_limit=1 << 30, hugepages_requests={2048: 1 << 21},
                               hugepages_limits={2048: 1 << 21},
                               device_numa_hints={"nvidia.com/gpu": {1}})
    containers = {
        "c1": ContainerRecord("c1", "sb1", "uid-1", request, frozenset({4, 5}), True,
                              frozenset({1})),
        "c2": ContainerRecord("c2", "sb1", "uid-1", ContainerRequest("side"),
                              frozenset({0, 1, 2, 3}), False, None, in_ledger=False),
    }
    return pods, containers


def test_records_round_trip_in_order():
    pods, containers = _records()
    data = json.loads(json.dumps(records_to_dict(pods, containers)))
    assert records_from_dict(data) == (pods, containers)
    assert list(records_from_dict(data)[1]) == ["c1", "c2"]


@pytest.mark.parametrize("record", [None, [], "pod", 3])
def test_a_record_that_is_no_object_is_refused_naming_it(record):
    data = json.loads(json.dumps(records_to_dict(*_records())))
    data["pods"][0] = record
    data["containers"][1] = record
    with pytest.raises(RecordError) as e:
        records_from_dict(data)
    assert str(e.value) == f"pods[0] must be an object, not {type(record).__name__}"
    del data["pods"][0]
    with pytest.raises(RecordError) as e:
        records_from_dict(data)
    assert str(e.value).startswith("containers[1] must be an object")


def test_a_pod_records_annotations_are_read_only():
    pods, _ = _records()
    with pytest.raises(TypeError):
        pods["sb1"].annotations["a"] = "c"  # read-only, as __post_init__ makes it


@pytest.mark.parametrize("path, value, message", [
    (("containers", 0, "cpus"), "0-", "containers\\[0\\]: bad element"),
    (("containers", 0, "exclusive"), "yes", "containers\\[0\\].exclusive must be true or false"),
    (("containers", 1, "request", "cpu_request"), -1, "containers\\[1\\]: .*cpu_request"),
    (("containers", 0, "request", "hugepages"), {"2M": 1}, "containers\\[0\\]"),
    (("pods", 0, "uid"), None, "pods\\[0\\].uid must be a string"),
    (("pods", 0, "annotations"), {"a": 1}, "pods\\[0\\].annotations"),
    (("pods",), {}, "pods must be a list"),
])
def test_bad_records_are_named(path, value, message):
    data = json.loads(json.dumps(records_to_dict(*_records())))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(RecordError, match=message):
        records_from_dict(data)
