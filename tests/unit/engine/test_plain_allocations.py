"""Allocations.from_dict reads each pod in its plain form in one pass (``_PlainReader``): it
must accept, make and refuse exactly what the field-by-field reader (``_pod_from_dict``) does,
with the same one-line errors. ContainerRequest skips the amount checks' messages for plain
amounts."""

from __future__ import annotations

import enum
import json

import pytest

from nri_numa.engine import allocations
from nri_numa.engine.allocations import Allocations, ContainerAllocation, PodAllocation
from nri_numa.engine.hints import Hint
from nri_numa.engine.request import ContainerKind, ContainerRequest, RequestError
from nri_numa.topology.cpulist import MAX_ID
from tests.unit.odd_fields import GONE, change

CPU_LISTS = ["0-3,8", "", " 4 ", "0-a", "70000", [1, 2], None, 3, GONE]
DEVICES = [{}, {"gpu": []}, {"gpu": ["a", "b"]}, {"gpu": [1]}, {"gpu": "a"}, {5: ["a"]}, [],
           None, GONE]
HINTS = [{"affinity": [0], "preferred": True}, {"affinity": None, "preferred": False},
         {"affinity": [], "preferred": True}, {"preferred": True}, {"affinity": [0]}, "x", [],
         None, GONE]
AFFINITIES = [[0], [], [0, 0], [1, 0], [True], [-1], [MAX_ID], [MAX_ID + 1], [1.0], "0", [[0]],
              None, GONE]
BOOLS = [True, False, 1, 0, "true", None, GONE]

POD_FIELDS = {"containers": [{}, [], "x", None, GONE], "pod_hint": HINTS,
              "reusable_cpus": CPU_LISTS, "reusable_devices": DEVICES}
CONTAINER_FIELDS = {"exclusive_cpus": CPU_LISTS, "admitted_cpus": ["4", "9", *CPU_LISTS],
                    "devices": DEVICES, "hint": HINTS}
HINT_FIELDS = {"affinity": AFFINITIES, "preferred": BOOLS}


def _snapshot() -> dict:
    pods = {
        "p1": PodAllocation(
            containers={
                "a": ContainerAllocation(frozenset({4, 5, 6}), {"nvidia.com/gpu": ("GPU-1",)},
                                         Hint({0}, True), frozenset({4, 5})),
                "b": ContainerAllocation(hint=Hint(None, True)),
            },
            pod_hint=Hint({0, 1}, False), reusable_cpus=frozenset({7}),
            reusable_devices={"nvidia.com/gpu": frozenset({"GPU-2"})}),
        "p2": PodAllocation(containers={"c": ContainerAllocation(frozenset({8}),
                                                                 hint=Hint({0}, True))}),
    }
    value = Allocations(frozenset({0, 1, 2, 3}), pods)
    return json.loads(json.dumps(value.to_dict()))


def _outcome(data: object) -> tuple[str, object]:
    try:
        value = Allocations.from_dict(data)
    except Exception as e:  # noqa: BLE001 - whatever either reader raises, compared
        return type(e).__name__, str(e)
    return "value", (value, repr(value), json.dumps(value.to_dict()),
                     [c.hint.mask for p in value.pods.values() for c in p.containers.values()])


def _checked_only(monkeypatch: pytest.MonkeyPatch, data: object) -> tuple[str, object]:
    """What the field-by-field reader alone makes of ``data``."""
    with monkeypatch.context() as m:
        m.setattr(allocations._PlainReader, "pod", lambda self, raw: None)
        return _outcome(data)



@pytest.mark.parametrize("key, value", [(k, v) for k, vs in POD_FIELDS.items() for v in vs])
def test_a_pod_field_reads_as_the_checked_reader_reads_it(monkeypatch, key, value):
    data = _snapshot()
    change(data["pods"]["p1"], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("key, value",
                         [(k, v) for k, vs in CONTAINER_FIELDS.items() for v in vs])
@pytest.mark.parametrize("name", ["a", "b"])
def test_a_container_field_reads_as_the_checked_reader_reads_it(monkeypatch, name, key, value):
    data = _snapshot()
    change(data["pods"]["p1"]["containers"][name], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("key, value", [(k, v) for k, vs in HINT_FIELDS.items() for v in vs])
@pytest.mark.parametrize("where", ["container", "pod"])
def test_a_hint_field_reads_as_the_checked_reader_reads_it(monkeypatch, where, key, value):
    data = _snapshot()
    pod = data["pods"]["p1"]
    change(pod["containers"]["a"]["hint"] if where == "container" else pod["pod_hint"], key,
             value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("record", [None, [], "pod", 3])
def test_a_pod_or_container_that_is_no_object_gets_the_same_error(monkeypatch, record):
    data = _snapshot()
    data["pods"]["p2"]["containers"]["c"] = record
    outcome = _outcome(data)
    assert outcome == ("AllocationsError", f"pods.p2.containers.c must be an object, not "
                                           f"{type(record).__name__}")
    assert outcome == _checked_only(monkeypatch, data)
    data["pods"]["p2"] = record
    assert _outcome(data) == _checked_only(monkeypatch, data)
    assert _outcome(data)[1].startswith("pods.p2 must be an object")


def test_a_container_name_that_is_not_a_string_reads_alike(monkeypatch):
    """Only a mapping made in Python has one (JSON keys are strings)."""
    data = _snapshot()
    data["pods"]["p1"]["containers"] = {7: data["pods"]["p1"]["containers"]["a"]}
    outcome = _outcome(data)
    assert outcome[0] == "value" and list(outcome[1][0].pods["p1"].containers) == ["7"]
    assert outcome == _checked_only(monkeypatch, data)


def test_pods_as_written_are_read_in_one_pass_sharing_their_hints(monkeypatch):
    data = _snapshot()
    expected = _checked_only(monkeypatch, data)

    def refused(raw: object, where: str) -> None:
        raise AssertionError(f"{where} was read field by field")

    with monkeypatch.context() as m:
        m.setattr(allocations, "_pod_from_dict", refused)
        assert _outcome(data) == expected
    value = Allocations.from_dict(data)
    assert value.pods["p1"].containers["a"].hint is value.pods["p2"].containers["c"].hint


class _Millicores(enum.IntEnum):
    ONE = 1000


@pytest.mark.parametrize("attr", ["cpu_request", "cpu_limit", "memory_request",
                                  "memory_limit"])
@pytest.mark.parametrize("amount, refused", [
    (0, False), (2000, False), (_Millicores.ONE, False), (-1, True), (True, True),
    (1.0, True), ("1", True), (None, True)])
def test_container_request_amounts_are_checked_one_by_one(attr, amount, refused):
    """Plain ints skip the per-amount checks; anything else still gets them, in field order."""
    if refused:
        later_bad = {} if attr == "memory_limit" else {"memory_limit": -2}
        with pytest.raises(RequestError) as e:
            ContainerRequest("a", **{attr: amount, **later_bad})
        assert str(e.value) == (f"container a: {attr} must be a non-negative integer, not "
                                f"{amount!r}")
    else:
        assert getattr(ContainerRequest("a", **{attr: amount}), attr) is amount


def test_a_container_kind_given_as_text_becomes_the_member():
    assert ContainerRequest("a", kind="init").kind is ContainerKind.INIT
    assert ContainerRequest("a", kind=ContainerKind.SIDECAR).kind is ContainerKind.SIDECAR
