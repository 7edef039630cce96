"""The record tables (nri_numa.nri.record_tables) and the encoded shared updates: what an event
changed is noted for the journal and undone exactly on a refusal, the indexes follow every
change, and the updates parsed from their encoding are the messages built one at a time."""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.request import ContainerRequest
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.record_tables import ContainerTable, TrackedDict
from nri_numa.state.plugin_records import ContainerRecord


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


def test_encoded_updates_are_the_messages_built_one_at_a_time() -> None:
    pool = frozenset(range(2, 5000, 3))
    ids = ["a", "é" * 40, "x" * 300, ""]
    wire = translate.updates_wire(api.CreateContainerResponse.UPDATE_FIELD_NUMBER, ids, pool)
    reply = api.CreateContainerResponse.FromString(wire)
    assert list(reply.update) == [translate.cpuset_update(i, pool) for i in ids]
    same_length = [f"{i:064x}" for i in range(5)]  # as runtimes make ids: the one-join path
    reply = api.CreateContainerResponse.FromString(translate.updates_wire(2, same_length, pool))
    assert list(reply.update) == [translate.cpuset_update(i, pool) for i in same_length]
    assert translate.updates_wire(1, [], pool) == b""
    skipped = api.UpdateContainersRequest.FromString(translate.updates_wire(1, ids, pool, "a"))
    assert [u.container_id for u in skipped.update] == ids[1:]
