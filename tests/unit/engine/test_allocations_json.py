"""Allocations.from_dict: what to_dict writes reads back as the same value, and a pod or
container that is no object is refused in one line naming it; ContainerRequest's checks of
its amounts and kind."""

from __future__ import annotations

import enum
import json

import pytest

from nri_numa.engine.allocations import (Allocations, AllocationsError, ContainerAllocation,
                                         PodAllocation)
from nri_numa.engine.hints import Hint
from nri_numa.engine.request import ContainerKind, ContainerRequest, RequestError


def _value() -> Allocations:
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
    return Allocations(frozenset({0, 1, 2, 3}), pods)


def _snapshot() -> dict:
    return json.loads(json.dumps(_value().to_dict()))


def test_a_snapshot_reads_back_as_written():
    value = Allocations.from_dict(_snapshot())
    assert value == _value()
    assert [c.hint.mask for p in value.pods.values() for c in p.containers.values()] == [
        0b1, None, 0b1]


@pytest.mark.parametrize("record", [None, [], "pod", 3])
def test_a_pod_or_container_that_is_no_object_is_refused_naming_it(record):
    data = _snapshot()
    data["pods"]["p2"]["containers"]["c"] = record
    with pytest.raises(AllocationsError) as e:
        Allocations.from_dict(data)
    assert str(e.value) == f"pods.p2.containers.c must be an object, not {type(record).__name__}"
    data["pods"]["p2"] = record
    with pytest.raises(AllocationsError) as e:
        Allocations.from_dict(data)
    assert str(e.value).startswith("pods.p2 must be an object")


def test_a_container_name_that_is_not_a_string_becomes_one():
    """Only a mapping made in Python has one (JSON keys are strings)."""
    data = _snapshot()
    data["pods"]["p1"]["containers"] = {7: data["pods"]["p1"]["containers"]["a"]}
    assert list(Allocations.from_dict(data).pods["p1"].containers) == ["7"]


class _Millicores(enum.IntEnum):
    ONE = 1000


@pytest.mark.parametrize("attr", ["cpu_request", "cpu_limit", "memory_request",
                                  "memory_limit"])
@pytest.mark.parametrize("amount, refused", [
    (0, False), (2000, False), (_Millicores.ONE, False), (-1, True), (True, True),
    (1.0, True), ("1", True), (None, True)])
def test_container_request_amounts_are_checked_in_field_order(attr, amount, refused):
    """The first bad amount is the one named, a later bad one notwithstanding."""
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
