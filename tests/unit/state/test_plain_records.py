"""records_from_dict reads pod and container records in their plain form in one pass
(``_plain_pod``, ``_plain_container``): it must accept, make and refuse exactly what the
field-by-field readers (``PodRecord.from_dict``, ``ContainerRecord.from_dict``) do, with the
same one-line errors."""

from __future__ import annotations

import json

import pytest

from nri_numa.engine.request import ContainerRequest
from nri_numa.state import plugin_records
from nri_numa.state.plugin_records import (ContainerRecord, PodRecord, records_from_dict,
                                           records_to_dict)
from tests.unit.odd_fields import GONE, change

STRINGS = ["a", "", None, 3, True, ["a"], {}, GONE]
NAMES = ["app", "", None, 3, GONE]
AMOUNTS = [0, 1000, 3000, -1, True, 1.5, "1000", None, 2 ** 70, GONE]
BOOLS = [True, False, 1, 0, "true", None, GONE]
CPU_LISTS = ["0-3,8", "4-5", "", " 4 ", "0-a", "70000", [1, 2], None, 3, GONE]
STRING_MAPS = [{}, {"a": "b"}, {"a": 1}, {1: "b"}, [], "a=b", None, GONE]
PAGES = [{}, {"2048": 2097152}, {"2048": 1}, {"2M": 1}, {"2048": -1}, {"0": 1}, {" 2048": 1},
         {"2048": True}, {"-2048": 1}, [], None, GONE]
HINTS = [{}, {"gpu": [0, 1]}, {"gpu": []}, {"gpu": [True]}, {"gpu": [70000]}, {"gpu": "01"},
         {"gpu": 5}, {"gpu": [[0]]}, {"gpu": [-1]}, [], None, GONE]

POD_FIELDS = {"sandbox_id": STRINGS, "uid": STRINGS, "namespace": STRINGS, "name": STRINGS,
              "cgroup_parent": STRINGS, "annotations": STRING_MAPS}
CONTAINER_FIELDS = {"id": STRINGS, "sandbox_id": STRINGS, "pod_uid": STRINGS,
                    "cpus": CPU_LISTS, "mems": CPU_LISTS, "exclusive": BOOLS,
                    "in_ledger": BOOLS, "request": [None, [], "x", {}, GONE]}
REQUEST_FIELDS = {"name": NAMES, "cpu_request": AMOUNTS, "cpu_limit": AMOUNTS,
                  "memory_request": AMOUNTS, "memory_limit": AMOUNTS, "hugepages": PAGES,
                  "device_numa_hints": HINTS, "isolated_cpus": ["0-1", "", None, 3, GONE],
                  "kind": ["init", "other", GONE]}


def _records() -> dict:
    pods = {"sb1": PodRecord("sb1", "uid-1", "ns", "pod", "/kubepods", {"a": "b"}),
            "sb2": PodRecord("sb2", "uid-2", "ns", "other")}
    request = ContainerRequest("app", cpu_request=2000, cpu_limit=2000, memory_request=1 << 30,
                               memory_limit=1 << 30, hugepages_requests={2048: 1 << 21},
                               hugepages_limits={2048: 1 << 21},
                               device_numa_hints={"nvidia.com/gpu": {1}}, isolated_cpus="6")
    containers = {
        "c1": ContainerRecord("c1", "sb1", "uid-1", request, frozenset({4, 5}), True,
                              frozenset({1})),
        "c2": ContainerRecord("c2", "sb1", "uid-1", ContainerRequest("side"),
                              frozenset({0, 1, 2, 3}), False, None, in_ledger=False),
        "c3": ContainerRecord("c3", "sb2", "uid-2", ContainerRequest("web", cpu_request=500),
                              frozenset({0, 1, 2, 3}), False),
    }
    return json.loads(json.dumps(records_to_dict(pods, containers)))


def _outcome(data: object) -> tuple[str, object]:
    try:
        pods, containers = records_from_dict(data)
    except Exception as e:  # noqa: BLE001 - whatever either reader raises, compared
        return type(e).__name__, str(e)
    return "value", (pods, containers, list(pods), list(containers),
                     json.dumps(records_to_dict(pods, containers)),
                     [type(c.request.kind) for c in containers.values()])


def _checked_only(monkeypatch: pytest.MonkeyPatch, data: object) -> tuple[str, object]:
    """What the field-by-field readers alone make of ``data``."""
    with monkeypatch.context() as m:
        m.setattr(plugin_records, "_plain_pod", lambda raw: None)
        m.setattr(plugin_records, "_plain_container", lambda raw, lists: None)
        return _outcome(data)



@pytest.mark.parametrize("key, value", [(k, v) for k, vs in POD_FIELDS.items() for v in vs])
def test_a_pod_field_reads_as_the_checked_reader_reads_it(monkeypatch, key, value):
    data = _records()
    change(data["pods"][1], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("key, value",
                         [(k, v) for k, vs in CONTAINER_FIELDS.items() for v in vs])
@pytest.mark.parametrize("index", [0, 1])
def test_a_container_field_reads_as_the_checked_reader_reads_it(monkeypatch, index, key,
                                                                 value):
    data = _records()
    change(data["containers"][index], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("key, value", [(k, v) for k, vs in REQUEST_FIELDS.items() for v in vs])
@pytest.mark.parametrize("index", [0, 1])
def test_a_request_field_reads_as_the_checked_reader_reads_it(monkeypatch, index, key, value):
    data = _records()
    change(data["containers"][index]["request"], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("record", [None, [], "pod", 3])
def test_a_record_that_is_no_object_gets_the_same_error(monkeypatch, record):
    data = _records()
    data["pods"][1] = record
    data["containers"][2] = record
    outcome = _outcome(data)
    assert outcome == ("RecordError", f"pods[1] must be an object, not {type(record).__name__}")
    assert outcome == _checked_only(monkeypatch, data)
    del data["pods"][1]
    assert _outcome(data) == _checked_only(monkeypatch, data)
    assert _outcome(data)[1].startswith("containers[2] must be an object")


def test_records_as_written_are_read_by_the_plain_readers(monkeypatch):
    """The case they are for: every record of a written payload, none left to from_dict."""
    def refused(raw: object, where: str) -> None:
        raise AssertionError(f"{where} was read field by field")

    data = _records()
    expected = _checked_only(monkeypatch, data)
    assert expected[0] == "value"
    with monkeypatch.context() as m:
        m.setattr(PodRecord, "from_dict", refused)
        m.setattr(ContainerRecord, "from_dict", refused)
        assert _outcome(data) == expected


def test_containers_on_one_pool_share_its_parsed_cpus():
    data = _records()
    _, containers = records_from_dict(data)
    assert containers["c2"].cpus == containers["c3"].cpus == frozenset({0, 1, 2, 3})
    assert containers["c2"].cpus is containers["c3"].cpus  # the pool's text parsed once


def test_a_pod_records_annotations_are_read_only():
    record = PodRecord("sb", "uid", "ns", "name", annotations={"a": "b"})
    with pytest.raises(TypeError):
        record.annotations["a"] = "c"  # read-only, as __post_init__ makes it
