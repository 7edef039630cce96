"""records_from_dict: what records_to_dict writes reads back as the same records in the same
order, and a record that is no object is refused in one line naming it."""

from __future__ import annotations

import json

import pytest

from nri_numa.engine.request import ContainerRequest
from nri_numa.state.plugin_records import (ContainerRecord, PodRecord, RecordError,
                                           records_from_dict, records_to_dict)


def _records() -> tuple[dict[str, PodRecord], dict[str, ContainerRecord]]:
    pods = {"sb1": PodRecord("sb1", "uid-1", "ns", "pod", "/kubepods", {"a": "b"}),
            "sb2": PodRecord("sb2", "uid-2", "ns", "other")}
    request = ContainerRequest("app", cpu_request=2000, cpu_limit=2000, memory_request=1 << 30,
                               memory_limit=1 << 30, hugepages_requests={2048: 1 << 21},
                               hugepages_limits={2048: 1 << 21},
                               device_numa_hints={"nvidia.com/gpu": {1}}, isolated_cpus="6")
    containers = {
        "c3": ContainerRecord("c3", "sb2", "uid-2", ContainerRequest("web", cpu_request=500),
                              frozenset({0, 1, 2, 3}), False),
        "c1": ContainerRecord("c1", "sb1", "uid-1", request, frozenset({4, 5}), True,
                              frozenset({1})),
        "c2": ContainerRecord("c2", "sb1", "uid-1", ContainerRequest("side"),
                              frozenset({0, 1, 2, 3}), False, None, in_ledger=False),
    }
    return pods, containers


def test_records_read_back_as_written_in_their_order():
    pods, containers = _records()
    read_pods, read_containers = records_from_dict(json.loads(json.dumps(
        records_to_dict(pods, containers))))
    assert read_pods == pods and read_containers == containers
    assert list(read_containers) == ["c3", "c1", "c2"]


@pytest.mark.parametrize("record", [None, [], "pod", 3])
def test_a_record_that_is_no_object_is_refused_naming_it(record):
    data = json.loads(json.dumps(records_to_dict(*_records())))
    data["pods"][1] = record
    data["containers"][2] = record
    with pytest.raises(RecordError) as e:
        records_from_dict(data)
    assert str(e.value) == f"pods[1] must be an object, not {type(record).__name__}"
    del data["pods"][1]
    with pytest.raises(RecordError) as e:
        records_from_dict(data)
    assert str(e.value).startswith("containers[2] must be an object")


def test_a_pod_records_annotations_are_read_only():
    record = PodRecord("sb", "uid", "ns", "name", annotations={"a": "b"})
    with pytest.raises(TypeError):
        record.annotations["a"] = "c"  # read-only, as __post_init__ makes it
