"""The allocations snapshot: its JSON form, its invariants, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from nri_numa.engine.allocations import (Allocations, AllocationsError, ContainerAllocation,
                                         PodAllocation)
from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import MemoryState
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import HugePages, NumaNode

ONLINE = parse_list("0-7")
GIB = 1 << 30


def cpus(text: str) -> frozenset[int]:
    return parse_list(text)


def snapshot(shared: str, pods: dict[str, dict[str, str]] | None = None,
             devices: dict[tuple[str, str], dict[str, tuple[str, ...]]] | None = None,
             **pod_fields) -> Allocations:
    """pods: pod → container → exclusive CPU list;
    devices: (pod, container) → resource → ids."""
    built = {}
    for pod_id, containers in (pods or {}).items():
        built[pod_id] = PodAllocation(containers={
            name: ContainerAllocation(cpus(held), (devices or {}).get((pod_id, name), {}))
            for name, held in containers.items()}, **pod_fields.get(pod_id, {}))
    return Allocations(shared=cpus(shared), pods=built)


def memory_state() -> MemoryState:
    nodes = (NumaNode(0, frozenset({0, 1}), 4 * GIB, {1048576: HugePages(2, 2)}),
             NumaNode(1, frozenset({2, 3}), 4 * GIB))
    return MemoryState.from_topology(Topology(cpus=(), numa_nodes=nodes), {0: {"memory": GIB}})


def rich() -> Allocations:
    pods = {
        "default/a": PodAllocation(
            containers={
                "init": ContainerAllocation(cpus("2-3"), {"nvidia.com/gpu": ("GPU-1",)},
                                            Hint({0}, True)),
                "app": ContainerAllocation(cpus("2"), {"nvidia.com/gpu": ("GPU-1", "GPU-0")},
                                           Hint({0}, True)),
                "shared": ContainerAllocation(hint=Hint(None, False)),
            },
            pod_hint=Hint({0, 1}, False), reusable_cpus=cpus("3"),
            reusable_devices={"nvidia.com/gpu": frozenset({"GPU-1"})}),
        "default/b": PodAllocation(containers={"c": ContainerAllocation(cpus("6-7"))}),
    }
    return Allocations(shared=cpus("0-1,4-5"), pods=pods, memory=memory_state())


# --- JSON -----------------------------------------------------------------------------------------

def test_json_round_trip_keeps_everything():
    original = rich()
    text = json.dumps(original.to_dict())
    again = Allocations.from_dict(json.loads(text))
    assert again == original
    assert list(again.pods["default/a"].containers) == ["init", "app", "shared"]  # admission order
    assert again.pods["default/a"].containers["app"].devices["nvidia.com/gpu"] == ("GPU-1", "GPU-0")
    assert again.to_dict() == original.to_dict()


def test_json_form_is_readable():
    data = rich().to_dict()
    assert data["shared"] == "0-1,4-5"
    pod = data["pods"]["default/a"]
    assert pod["containers"]["init"] == {"exclusive_cpus": "2-3",
                                         "devices": {"nvidia.com/gpu": ["GPU-1"]},
                                         "hint": {"affinity": [0], "preferred": True}}
    assert pod["containers"]["shared"]["hint"] == {"affinity": None, "preferred": False}
    assert pod["pod_hint"] == {"affinity": [0, 1], "preferred": False}
    assert pod["reusable_cpus"] == "3" and pod["reusable_devices"] == {"nvidia.com/gpu": ["GPU-1"]}
    assert data["pods"]["default/b"]["pod_hint"] is None
    assert Allocations(shared=ONLINE).to_dict() == {"shared": "0-7", "pods": {}, "memory": None}


def test_the_snapshot_cannot_be_changed_in_place():
    allocs = rich()
    with pytest.raises(TypeError):
        allocs.pods["x"] = PodAllocation()  # type: ignore[index]
    with pytest.raises(TypeError):
        allocs.pods["default/a"].containers["x"] = ContainerAllocation()  # type: ignore[index]
    with pytest.raises(AttributeError):
        allocs.shared = frozenset()  # type: ignore[misc]


BAD_JSON = [
    ([], "allocations must be an object, not list"),
    ({"pods": {}}, 'shared must be a CPU list such as "0-3", not None'),
    ({"shared": 3}, 'shared must be a CPU list such as "0-3", not 3'),
    ({"shared": "0-x"}, "shared: "),
    ({"shared": "0-7", "pods": []}, "pods must be an object, not list"),
    ({"shared": "0-7", "pods": {"p": 1}}, "pods.p must be an object, not int"),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": "x"}}}},
     "pods.p.containers.c must be an object, not str"),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": {"exclusive_cpus": [1, 2]}}}}},
     'pods.p.containers.c.exclusive_cpus must be a CPU list such as "0-3"'),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": {"hint": {"affinity": None}}}}}},
     "pods.p.containers.c.hint.preferred must be true or false"),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": {"hint": {"affinity": "0",
                                                                  "preferred": True}}}}}},
     "pods.p.containers.c.hint.affinity must be null or a list of NUMA node ids"),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": {"hint": {"affinity": [-1],
                                                                  "preferred": True}}}}}},
     "pods.p.containers.c.hint.affinity must be null or a list of NUMA node ids"),
    ({"shared": "0-7", "pods": {"p": {"containers": {"c": {
        "devices": {"nvidia.com/gpu": "GPU-0"}, "hint": {"affinity": None, "preferred": False}}}}}},
     "pods.p.containers.c.devices.nvidia.com/gpu must be a list of strings"),
    ({"shared": "0-7", "pods": {"p": {"pod_hint": {"affinity": [0]}}}},
     "pods.p.pod_hint.preferred must be true or false"),
    ({"shared": "0-7", "pods": {"p": {"reusable_cpus": None}}},
     'pods.p.reusable_cpus must be a CPU list such as "0-3", not None'),
    ({"shared": "0-7", "pods": {"p": {"reusable_devices": {"r": [1]}}}},
     "pods.p.reusable_devices.r must be a list of strings"),
    ({"shared": "0-7", "memory": {"machineState": 3}}, "memory: "),
]


@pytest.mark.parametrize(("data", "message"), BAD_JSON, ids=[m for _, m in BAD_JSON])
def test_bad_json_names_the_field(data, message):
    with pytest.raises(AllocationsError) as error:
        Allocations.from_dict(data)
    assert str(error.value).startswith(message)


def test_a_missing_hint_is_an_error_not_a_guess():
    data = {"shared": "0-7", "pods": {"p": {"containers": {"c": {"exclusive_cpus": "1"}}}}}
    with pytest.raises(AllocationsError, match="pods.p.containers.c.hint must be an object"):
        Allocations.from_dict(data)


# --- invariants ---------------------------------------------------------------------------------

def test_a_consistent_snapshot_passes():
    snapshot("0-1,4-5", {"a": {"x": "2-3"}, "b": {"y": "6-7"}}).check(ONLINE, cpus("0"), False)
    # Init and app containers of one pod may hold the same CPUs and devices.
    gpu = {"nvidia.com/gpu": ("GPU-0",)}
    snapshot("0-1,4-7", {"a": {"init": "2-3", "app": "2-3"}},
             {("a", "init"): gpu, ("a", "app"): gpu}).check(ONLINE, cpus("0"), False)
    # Strict reservation keeps the reserved CPUs out of every set.
    snapshot("1-5", {"a": {"x": "6-7"}}).check(ONLINE, cpus("0"), True)
    Allocations(shared=ONLINE).check(ONLINE, frozenset(), False)


VIOLATIONS = [
    ("a CPU exclusive to two pods", snapshot("0-1,4-7", {"a": {"x": "2-3"}, "b": {"y": "3"}}),
     cpus("0"), False, "CPU 3 is exclusive to both pod a and pod b"),
    ("a device held by two pods",
     snapshot("0-7", {"a": {"x": ""}, "b": {"y": ""}},
              {("a", "x"): {"nvidia.com/gpu": ("GPU-0",)},
               ("b", "y"): {"nvidia.com/gpu": ("GPU-1", "GPU-0")}}),
     cpus("0"), False, "nvidia.com/gpu device GPU-0 is held by pods a and b"),
    ("exclusive CPUs in the shared pool", snapshot("0-5", {"a": {"x": "4-7"}}), cpus("0"), False,
     "CPUs 4-5 are both exclusive and in the shared pool"),
    ("a reserved CPU given exclusively", snapshot("1-7", {"a": {"x": "0"}}), cpus("0"), False,
     "reserved CPUs 0 are allocated exclusively"),
    ("a CPU nowhere", snapshot("0-1,4-6", {"a": {"x": "2-3"}}), cpus("0"), False,
     "shared pool and exclusive CPUs do not cover the CPUs exactly; missing 7"),
    ("a CPU the machine lacks", snapshot("0-1,4-8", {"a": {"x": "2-3"}}), cpus("0"), False,
     "shared pool and exclusive CPUs do not cover the CPUs exactly; unexpected 8"),
    ("both at once", snapshot("0-1,4-6,9", {"a": {"x": "2-3"}}), cpus("0"), False,
     "shared pool and exclusive CPUs do not cover the CPUs exactly; missing 7; unexpected 9"),
    ("a reserved CPU shared under strict reservation", snapshot("0-5", {"a": {"x": "6-7"}}),
     cpus("0"), True,
     "shared pool and exclusive CPUs do not cover the CPUs exactly; unexpected 0"),
    ("a reserved CPU missing without strict reservation", snapshot("1-5", {"a": {"x": "6-7"}}),
     cpus("0"), False, "shared pool and exclusive CPUs do not cover the CPUs exactly; missing 0"),
    ("an empty shared pool", snapshot("", {"a": {"x": "0-7"}}), frozenset(), False,
     "the shared pool is empty while CPUs are allocated"),
]


@pytest.mark.parametrize(("name", "allocs", "reserved", "strict", "message"), VIOLATIONS,
                         ids=[v[0] for v in VIOLATIONS])
def test_every_violation_is_named(name, allocs, reserved, strict, message):
    with pytest.raises(AllocationsError) as error:
        allocs.check(ONLINE, reserved, strict)
    assert str(error.value) == message


def test_a_violation_survives_the_json_round_trip():
    broken = snapshot("0-5", {"a": {"x": "4-7"}})
    again = Allocations.from_dict(json.loads(json.dumps(broken.to_dict())))
    with pytest.raises(AllocationsError, match="both exclusive and in the shared pool"):
        again.check(ONLINE, frozenset(), False)


# --- helpers the providers lean on ----------------------------------------------------------------

def test_lookups_and_updates_return_new_values():
    allocs = rich()
    assert allocs.exclusive_cpus() == cpus("2-3,6-7")
    assert allocs.devices_in_use("nvidia.com/gpu") == {"GPU-0", "GPU-1"}
    assert allocs.devices_in_use("nvidia.com/gpu", except_pod="default/a") == frozenset()
    assert allocs.pods["default/a"].cpus_in_use(except_container="init") == cpus("2")
    assert allocs.pod("nobody") == PodAllocation() and allocs.container("nobody", "x") is None
    smaller = allocs.without_pod("default/b")
    assert "default/b" in allocs.pods and list(smaller.pods) == ["default/a"]
    grown = allocs.with_pod("default/c", PodAllocation())
    assert list(grown.pods) == ["default/a", "default/b", "default/c"] and grown != allocs


def test_empty_reusable_device_lists_are_dropped():
    assert PodAllocation(reusable_devices={"r": frozenset()}).reusable_devices == {}
