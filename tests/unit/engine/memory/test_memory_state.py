"""Default machine state, the static policy's start-up checks, validate/restore and JSON."""

from __future__ import annotations

import copy
import json

import pytest
from mm_builders import (
    GB,
    HP1G,
    HP2M,
    MB,
    assert_same_machine,
    blocks,
    node,
    state,
    table,
)

from nri_numa.engine.memory import (
    MemoryState,
    MemoryStateError,
    ReservedMemoryError,
    check_reserved_memory,
    restore,
)
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import HugePages, NumaNode

PAGE_1G = 1048576  # KiB
PAGE_2M = 2048


def machine(*nodes: tuple[int, int, dict[int, int]]) -> Topology:
    """(node id, memory bytes, {page size KiB: pages})."""
    return Topology(
        cpus=(),
        numa_nodes=tuple(
            NumaNode(
                id=i,
                cpus=frozenset(),
                memory_bytes=mem,
                hugepages={k: HugePages(total=p, free=p) for k, p in pages.items()},
            )
            for i, mem, pages in nodes
        ),
    )


RESERVED_512M = {0: {"memory": 512 * MB}}


# --- default state ------------------------------------------------------------------------


def test_default_state_carves_hugepages_out_of_memory() -> None:
    # kubelet TestStaticPolicyStart "should fill the state with default values"
    got = MemoryState.from_topology(machine((0, 3 * GB, {PAGE_1G: 1})), RESERVED_512M)
    assert_same_machine(
        got,
        state(
            {
                0: node(
                    [0],
                    0,
                    memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 3 * GB),
                    hp1g=table(GB, GB, 0, 0, GB),
                )
            }
        ),
    )
    assert got.nodes[0] == node(
        [0],
        0,
        memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 3 * GB),
        hp1g=table(GB, GB, 0, 0, GB),
    )


def test_default_state_per_node_hugepage_sizes_and_reservations() -> None:
    topo = machine((0, 8 * GB, {PAGE_2M: 512, PAGE_1G: 2}), (1, 8 * GB, {PAGE_2M: 0, PAGE_1G: 0}))
    got = MemoryState.from_topology(topo, {0: {"memory": GB, HP2M: 256 * MB}, 1: {"memory": GB}})
    n0, n1 = got.nodes[0], got.nodes[1]
    assert n0.tables[HP2M] == table(768 * MB, 768 * MB, 0, 256 * MB, GB)
    assert n0.tables[HP1G] == table(2 * GB, 2 * GB, 0, 0, 2 * GB)
    assert n0.tables["memory"] == table(4 * GB, 4 * GB, 0, GB, 8 * GB)  # 8 - 1 - 1 - 2
    assert n1.tables[HP1G].total == 0 and n1.tables["memory"].allocatable == 7 * GB
    assert n0.cells == (0,) and n1.cells == (1,) and n0.assignments == n1.assignments == 0


@pytest.mark.parametrize(
    "kib, name",
    [
        (2048, "hugepages-2Mi"),
        (1048576, "hugepages-1Gi"),
        (64, "hugepages-64Ki"),  # arm64 with 4K pages, contiguous-PTE size
        (32768, "hugepages-32Mi"),  # arm64 with 16K pages
        (16 * 1048576, "hugepages-16Gi"),  # ppc64
    ],
)
def test_hugepage_tables_are_named_as_kubernetes_names_them(kib: int, name: str) -> None:
    got = MemoryState.from_topology(machine((0, 64 * GB, {kib: 1})), RESERVED_512M)
    assert set(got.nodes[0].tables) == {"memory", name}
    assert got.nodes[0].tables[name].total == kib * 1024


@pytest.mark.parametrize(
    "topo, reserved, message",
    [
        (machine((0, GB, {})), {0: {"memory": 2 * GB}}, "memory reserved 2Gi is more than the 1Gi"),
        (
            machine((0, GB, {PAGE_1G: 2})),
            {0: {"memory": 1}},
            r"hugepages \(2Gi\) are more than its memory \(1Gi\)",
        ),
        (machine((0, 3 * GB, {PAGE_1G: 2})), {0: {"memory": 2 * GB}}, "1Gi it has after hugepages"),
        (
            machine((0, 4 * GB, {PAGE_2M: 1})),
            {0: {"memory": 1, HP2M: 4 * MB}},
            "hugepages-2Mi reserved",
        ),
        (
            machine((0, 4 * GB, {PAGE_2M: 1})),
            {0: {"memory": 1, HP1G: GB}},
            "names hugepages-1Gi, which that node does not have",
        ),
    ],
)
def test_default_state_refuses_impossible_reservations(
    topo: Topology, reserved: dict, message: str
) -> None:
    with pytest.raises(ReservedMemoryError, match=message):
        MemoryState.from_topology(topo, reserved)


# --- the static policy's start-up check (TestStaticPolicyNew and friends) ---------------------


def test_no_system_reserved_memory_is_refused_with_the_kubelet_message() -> None:
    with pytest.raises(
        ReservedMemoryError,
        match=r"^\[memorymanager\] you should specify the system reserved memory$",
    ):
        check_reserved_memory(machine((0, 4 * GB, {})), {})


def test_reserved_memory_on_one_node_is_enough() -> None:
    check_reserved_memory(
        machine((0, 4 * GB, {}), (1, 4 * GB, {})), {0: {}, 1: {"memory": 512 * MB}}
    )


@pytest.mark.parametrize(
    "reserved, message",
    [
        (
            {0: {"memory": 12}, 2: {"memory": 5}},
            "references a NUMA node 2 that does not exist on this machine",
        ),
        ({0: {"cpu": 1, "memory": 1}}, "neither memory nor hugepages"),
        ({0: {"memory": -1}}, "not a number of bytes"),
        ({0: {HP1G: GB}}, "you should specify the system reserved memory"),
        ({0: {"memory": 8 * GB}}, "more than"),
    ],
)
def test_reserved_memory_checks(reserved: dict, message: str) -> None:
    with pytest.raises(ReservedMemoryError, match=message):
        check_reserved_memory(
            machine((0, 4 * GB, {PAGE_1G: 1}), (1, 4 * GB, {PAGE_1G: 1})), reserved
        )


# --- validate / restore (TestStaticPolicyStart) ------------------------------------------------

TWO_GB_NODE = machine((0, 2 * GB, {PAGE_1G: 1}))
DEFAULT_MEM = table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)
DEFAULT_HP = table(GB, GB, 0, 0, GB)
MISMATCH = r"^\[memorymanager\] the expected machine state is different from the real one"

START_FAILURES = {
    "machine state does not have all NUMA nodes": (
        machine((0, 2 * GB, {PAGE_1G: 1}), (1, 2 * GB, {PAGE_1G: 1})),
        {0: node([0], 0, memory=DEFAULT_MEM, hp1g=DEFAULT_HP)},
        {},
        MISMATCH,
    ),
    "machine state does not have memory resource": (
        TWO_GB_NODE,
        {0: node([0], 0, hp1g=DEFAULT_HP)},
        {},
        MISMATCH,
    ),
    "wrong size of total memory": (
        TWO_GB_NODE,
        {
            0: node(
                [0], 0, memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 1536 * MB), hp1g=DEFAULT_HP
            )
        },
        {},
        MISMATCH,
    ),
    "wrong size of system reserved memory": (
        TWO_GB_NODE,
        {0: node([0], 0, memory=table(1536 * MB, 1536 * MB, 0, 1024, 2 * GB), hp1g=DEFAULT_HP)},
        {},
        MISMATCH,
    ),
    "reserved memory differs from the memory of all assignments": (
        TWO_GB_NODE,
        {0: node([0], 1, memory=DEFAULT_MEM, hp1g=DEFAULT_HP)},
        {"pod": {"container1": blocks(((0,), "memory", 512 * MB))}},
        MISMATCH,
    ),
    # The kubelet's tables for these three do not add up (2Gi of memory cannot hold 512Mi
    # reserved and 2Gi or 4Gi of hugepages); the memory here is large enough that only the
    # hugepages differ.
    "wrong size of hugepages": (
        machine((0, 4 * GB, {PAGE_1G: 2})),
        {0: node([0], 0, memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 4 * GB), hp1g=DEFAULT_HP)},
        {},
        MISMATCH + r" \(node 0 hugepages-1Gi total is 1073741824, expected 2147483648\)$",
    ),
    "wrong size of system reserved hugepages": (
        machine((0, 4 * GB, {PAGE_1G: 2})),
        {
            0: node(
                [0],
                0,
                memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 4 * GB),
                hp1g=table(GB, GB, 0, GB, 2 * GB),
            )
        },
        {},
        MISMATCH + r" \(node 0 hugepages-1Gi system_reserved is 1073741824, expected 0\)$",
    ),
    "hugepages reserved differs from the hugepages of all assignments": (
        machine((0, 6 * GB, {PAGE_1G: 4})),
        {
            0: node(
                [0],
                2,
                memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 6 * GB),
                hp1g=table(4 * GB, GB, 3 * GB, 0, 4 * GB),
            )
        },
        {
            "pod1": {"container1": blocks(((0,), HP1G, GB))},
            "pod2": {"container2": blocks(((0,), HP1G, GB))},
        },
        MISMATCH + r" \(nodes \[0\] hugepages-1Gi free is 1073741824, expected 2147483648\)$",
    ),
    "assignment uses a NUMA node that does not exist": (
        TWO_GB_NODE,
        {0: node([0], 0, memory=DEFAULT_MEM, hp1g=DEFAULT_HP)},
        {"pod1": {"container1": blocks(((1,), "memory", GB))}},
        r"^\[memorymanager\] \(pod: pod1, container: container1\) the memory assignment uses the "
        r"NUMA that does not exist$",
    ),
    "assignment uses a resource that does not exist": (
        TWO_GB_NODE,
        {0: node([0], 2, memory=DEFAULT_MEM, hp1g=DEFAULT_HP)},
        {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP2M, GB))}},
        r"^\[memorymanager\] \(pod: pod1, container: container1\) the memory assignment uses "
        r"memory resource that does not exist$",
    ),
    "number of assignments differs": (
        TWO_GB_NODE,
        {0: node([0], 1, memory=DEFAULT_MEM, hp1g=DEFAULT_HP)},
        {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP1G, GB))}},
        MISMATCH,
    ),
}


@pytest.mark.parametrize("case", START_FAILURES)
def test_validate_reports_the_kubelet_errors(case: str) -> None:
    topo, nodes, entries, message = START_FAILURES[case]
    default = MemoryState.from_topology(topo, RESERVED_512M)
    with pytest.raises(MemoryStateError, match=message):
        restore(state(nodes, entries), default)


def test_empty_state_with_assignments_is_refused() -> None:
    default = MemoryState.from_topology(TWO_GB_NODE, RESERVED_512M)
    stored = MemoryState(
        nodes={}, blocks={"pod": {"container1": blocks(((0,), "memory", 512 * MB))}}
    )
    with pytest.raises(
        MemoryStateError,
        match=r"^\[memorymanager\] machine state can not be empty "
        r"when it has memory assignments$",
    ):
        restore(stored, default)


def test_empty_state_restores_to_the_default() -> None:
    default = MemoryState.from_topology(TWO_GB_NODE, RESERVED_512M)
    assert restore(MemoryState(nodes={}), default) == default


def test_cross_numa_state_validates_whatever_order_blocks_spilled_in() -> None:
    # kubelet "should validate cross NUMA reserved memory vs container assignments": the split
    # between nodes 0 and 1 is one of two orders of replay; only the group sums must match.
    topo = machine((0, 2176 * MB, {PAGE_1G: 1}), (1, 2176 * MB, {PAGE_1G: 1}))
    default = MemoryState.from_topology(topo, {0: {"memory": 512 * MB}, 1: {"memory": 512 * MB}})
    entries = {
        "pod1": {"container1": blocks(((0, 1), "memory", 768 * MB), ((0, 1), HP1G, GB))},
        "pod2": {"container2": blocks(((0, 1), "memory", 256 * MB), ((0, 1), HP1G, GB))},
    }
    hp = table(GB, 0, GB, 0, GB)
    nodes = {
        0: node([0, 1], 4, memory=table(640 * MB, 0, 640 * MB, 512 * MB, 2176 * MB), hp1g=hp),
        1: node(
            [0, 1], 4, memory=table(640 * MB, 256 * MB, 384 * MB, 512 * MB, 2176 * MB), hp1g=hp
        ),
    }
    stored = state(nodes, entries)
    assert restore(stored, default) is stored
    # the other order of replay puts the split elsewhere and is just as valid
    swapped = {
        0: node(
            [0, 1], 4, memory=table(640 * MB, 256 * MB, 384 * MB, 512 * MB, 2176 * MB), hp1g=hp
        ),
        1: node([0, 1], 4, memory=table(640 * MB, 0, 640 * MB, 512 * MB, 2176 * MB), hp1g=hp),
    }
    state(swapped, entries).validate(default)


# --- JSON ---------------------------------------------------------------------------------


def _sample() -> MemoryState:
    hp = table(GB, 0, GB, 0, GB)
    return state(
        {
            0: node([0, 1], 2, memory=table(GB, 0, GB, 512 * MB, 2 * GB), hp1g=hp),
            1: node(
                [0, 1],
                2,
                memory=table(GB, 512 * MB, 512 * MB, 512 * MB, 2 * GB),
                hp1g=table(GB, GB, 0, 0, GB),
            ),
            2: node(
                [2], 0, memory=table(GB, GB, 0, 512 * MB, 2 * GB), hp1g=table(GB, GB, 0, 0, GB)
            ),
        },
        {
            "pod1": {
                "init": blocks(((0, 1), "memory", 0)),
                "app": blocks(((0, 1), "memory", 1536 * MB), ((0, 1), HP1G, GB)),
            }
        },
        {"pod1": {(0, 1): {"memory": 512 * MB}}},
    )


def test_json_round_trip() -> None:
    original = _sample()
    text = json.dumps(original.to_dict())
    assert MemoryState.from_dict(json.loads(text)) == original


def test_json_uses_the_kubelet_checkpoint_field_names() -> None:
    d = _sample().to_dict()
    assert d["machineState"]["0"] == {
        "numberOfAssignments": 2,
        "cells": [0, 1],
        "memoryMap": {
            "hugepages-1Gi": {
                "total": GB,
                "systemReserved": 0,
                "allocatable": GB,
                "reserved": GB,
                "free": 0,
            },
            "memory": {
                "total": 2 * GB,
                "systemReserved": 512 * MB,
                "allocatable": GB,
                "reserved": GB,
                "free": 0,
            },
        },
    }
    assert d["entries"]["pod1"]["app"][1] == {"numaAffinity": [0, 1], "type": HP1G, "size": GB}
    assert d["reusable"] == {"pod1": [{"numaAffinity": [0, 1], "type": "memory", "size": 512 * MB}]}


def _broken(path: tuple, value: object) -> dict:
    d = copy.deepcopy(_sample().to_dict())
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("machineState",), [], "machineState must be an object"),
        (
            ("machineState", "0", "memoryMap", "memory", "free"),
            -1,
            r"machineState\.0\.memoryMap\.memory\.free must be a non-negative integer",
        ),
        (
            ("machineState", "0", "memoryMap", "memory", "reserved"),
            5,
            r"machineState\.0\.memoryMap\.memory: free 0 \+ reserved 5 is not allocatable",
        ),
        (
            ("machineState", "0", "memoryMap", "memory", "total"),
            KeyError,
            r"machineState\.0\.memoryMap\.memory\.total must be a non-negative integer, not None",
        ),
        (("machineState", "0", "numberOfAssignments"), True, r"numberOfAssignments must be"),
        (
            ("machineState", "0", "cells"),
            [1],
            r"machineState\.0\.cells \[1\] does not contain node 0",
        ),
        (
            ("machineState", "0", "cells"),
            [0, 7],
            r"names NUMA nodes \[7\] that are not in machineState",
        ),
        (
            ("machineState", "0", "cells"),
            [],
            r"machineState\.0\.cells must list distinct NUMA node ids",
        ),
        (("machineState", "x"), {}, r"key 'x' is not a NUMA node id"),
        (("machineState", "0", "memoryMap", "cpu"), {}, r"'cpu' is neither memory nor hugepages"),
        (
            ("entries", "pod1", "app", 0, "numaAffinity"),
            [0, 0],
            r"entries\.pod1\.app\[0\]\.numaAffinity",
        ),
        (("entries", "pod1", "app", 0, "type"), "cpu", r"entries\.pod1\.app\[0\]\.type"),
        (("entries", "pod1", "app"), {}, r"entries\.pod1\.app must be a list"),
        (("reusable", "pod1", 0, "size"), "1Gi", r"reusable\.pod1\[0\]\.size"),
    ],
)
def test_from_dict_names_the_bad_field(path: tuple, value: object, message: str) -> None:
    with pytest.raises(MemoryStateError, match=message):
        MemoryState.from_dict(_broken(path, value))


def test_from_dict_of_nothing_is_the_empty_state() -> None:
    assert MemoryState.from_dict({}) == MemoryState(nodes={})
    with pytest.raises(MemoryStateError, match="state must be an object"):
        MemoryState.from_dict("[]")
