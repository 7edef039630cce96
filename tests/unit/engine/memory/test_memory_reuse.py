"""Init-container memory reuse (kubelet §5.6): TestStaticPolicyAllocateWithInitContainers and
TestStaticPolicyAllocateWithRestartableInitContainers, containers allocated in spec order."""

from __future__ import annotations

import pytest
from mm_builders import (
    GB,
    HP1G,
    MB,
    assert_same_blocks,
    assert_same_machine,
    blocks,
    node,
    state,
    table,
)

from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import InitContainer, MemoryState, allocate, remove

NO_AFFINITY = Hint(None, False)


def one_node(
    memory_allocatable: int, hugepages: int, system_reserved: int = 512 * MB
) -> MemoryState:
    return state(
        {
            0: node(
                [0],
                0,
                memory=table(
                    memory_allocatable,
                    memory_allocatable,
                    0,
                    system_reserved,
                    memory_allocatable + system_reserved,
                ),
                hp1g=table(hugepages, hugepages, 0, 0, hugepages),
            )
        }
    )


def run_pod(
    s: MemoryState,
    inits: list[tuple[str, bool, int]],
    apps: list[tuple[str, int]],
    pod: str = "pod1",
) -> MemoryState:
    """Allocate every container (init containers first, in order); sizes in GiB for memory and
    1Gi hugepages alike."""
    init_containers = [InitContainer(name, restartable) for name, restartable, _ in inits]
    for name, size in [(name, size) for name, _, size in inits] + apps:
        s = allocate(
            s,
            pod,
            name,
            {"memory": size * GB, HP1G: size * GB},
            NO_AFFINITY,
            init_containers=init_containers,
        )
    return s


def both(size: int) -> tuple:
    return blocks(((0,), "memory", size), ((0,), HP1G, size))


# (init containers (name, restartable, GiB), apps (name, GiB), node allocatable memory/hugepages,
#  expected block sizes in GiB per container, expected reserved GiB, assignments)
CASES = {
    "init 1Gi and 2Gi, apps 3Gi and 4Gi": (
        [("initContainer1", False, 1), ("initContainer2", False, 2)],
        [("container1", 3), ("container2", 4)],
        7680 * MB,
        8 * GB,
        {"initContainer1": 0, "initContainer2": 0, "container1": 3, "container2": 4},
        7,
        8,
    ),
    "init 4Gi and 3Gi, apps 2Gi and 1Gi": (
        [("initContainer1", False, 4), ("initContainer2", False, 3)],
        [("container1", 2), ("container2", 1)],
        7680 * MB,
        8 * GB,
        {"initContainer1": 0, "initContainer2": 1, "container1": 2, "container2": 1},
        4,
        8,
    ),
    "init 7Gi and 4Gi, apps 4Gi and 3Gi": (
        [("initContainer1", False, 7), ("initContainer2", False, 4)],
        [("container1", 4), ("container2", 3)],
        7680 * MB,
        8 * GB,
        {"initContainer1": 0, "initContainer2": 0, "container1": 4, "container2": 3},
        7,
        8,
    ),
    "init 7Gi and 4Gi, apps 5Gi and 2Gi": (
        [("initContainer1", False, 7), ("initContainer2", False, 4)],
        [("container1", 5), ("container2", 2)],
        10 * GB,
        10 * GB,
        {"initContainer1": 0, "initContainer2": 0, "container1": 5, "container2": 2},
        7,
        8,
    ),
    "restartable init containers are not reused": (
        [
            ("initContainer1", False, 1),
            ("restartableInitContainer2", True, 2),
            ("initContainer3", False, 3),
            ("restartableInitContainer4", True, 4),
        ],
        [("container1", 1)],
        7 * GB,
        7 * GB,
        {
            "initContainer1": 0,
            "restartableInitContainer2": 2,
            "initContainer3": 0,
            "restartableInitContainer4": 4,
            "container1": 1,
        },
        7,
        10,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_init_container_memory_is_reused(case: str) -> None:
    inits, apps, memory, hugepages, sizes, reserved, assignments = CASES[case]
    # The last kubelet case starts with another pod's leftover record. The kubelet drops it; we
    # keep it (pods' containers interleave through NRI) and it does not change this pod's result.
    start = one_node(memory, hugepages)
    start = MemoryState(start.nodes, reusable={"pod0": {(0,): {"memory": 5 * GB}}})
    got = run_pod(start, inits, apps)
    assert_same_blocks(got, {"pod1": {name: both(gib * GB) for name, gib in sizes.items()}})
    expected_memory = table(
        memory, memory - reserved * GB, reserved * GB, 512 * MB, memory + 512 * MB
    )
    expected_hp = table(hugepages, hugepages - reserved * GB, reserved * GB, 0, hugepages)
    assert_same_machine(
        got, state({0: node([0], assignments, memory=expected_memory, hp1g=expected_hp)})
    )
    # the blocks of the pod add up to what it holds
    for resource in ("memory", HP1G):
        held = sum(b.size for bs in got.blocks["pod1"].values() for b in bs if b.type == resource)
        assert held == got.nodes[0].tables[resource].reserved
    assert set(got.reusable) <= {"pod0", "pod1"}
    assert got.reusable["pod0"] == {(0,): {"memory": 5 * GB}}


def test_reuse_record_follows_the_kubelet_bookkeeping() -> None:
    inits = [InitContainer("init1"), InitContainer("init2")]
    s = one_node(7680 * MB, 8 * GB)
    s = allocate(s, "pod1", "init1", {"memory": 4 * GB}, NO_AFFINITY, init_containers=inits)
    assert s.reusable == {"pod1": {(0,): {"memory": 4 * GB}}}
    s = allocate(s, "pod1", "init2", {"memory": 3 * GB}, NO_AFFINITY, init_containers=inits)
    assert s.reusable == {"pod1": {(0,): {"memory": 4 * GB}}}  # the largest one bounds it
    s = allocate(s, "pod1", "app", {"memory": GB}, NO_AFFINITY, init_containers=inits)
    assert s.reusable == {"pod1": {(0,): {"memory": 3 * GB}}}
    s = allocate(s, "pod1", "app2", {"memory": 5 * GB}, NO_AFFINITY, init_containers=inits)
    assert s.reusable == {"pod1": {(0,): {"memory": 0}}}
    assert s.nodes[0].tables["memory"].reserved == 6 * GB  # 4 reused, 1 + 5 - 4 new


def test_reuse_is_per_mask() -> None:
    # An app container placed on another NUMA node cannot reuse the init container's memory.
    two = state({i: node([i], 0, memory=table(4 * GB, 4 * GB, 0, 0, 4 * GB)) for i in (0, 1)})
    inits = [InitContainer("init")]
    s = allocate(
        two, "pod", "init", {"memory": 3 * GB}, Hint(frozenset({0}), True), init_containers=inits
    )
    s = allocate(
        s, "pod", "app", {"memory": 3 * GB}, Hint(frozenset({1}), True), init_containers=inits
    )
    assert (
        s.nodes[0].tables["memory"].reserved == 3 * GB
        and s.nodes[1].tables["memory"].reserved == 3 * GB
    )
    assert s.container_blocks("pod", "init") == blocks(((0,), "memory", 3 * GB))


def test_already_allocated_container_refreshes_the_reuse_record_only() -> None:
    # kubelet "should do nothing once containers already exist under the state file"
    s = state(
        {
            0: node(
                [0],
                2,
                memory=table(2560 * MB, 512 * MB, 2 * GB, 512 * MB, 3 * GB),
                hp1g=table(2 * GB, 2 * GB, 0, 0, 2 * GB),
            )
        },
        {
            "pod1": {
                "initContainer1": blocks(((0,), "memory", GB)),
                "container1": blocks(((0,), "memory", GB)),
            }
        },
        {"other": {(0,): {"memory": GB}}},
    )
    inits = [InitContainer("initContainer1", restartable=True)]
    for name in ("initContainer1", "container1"):
        got = allocate(
            s, "pod1", name, {"memory": GB, HP1G: GB}, NO_AFFINITY, init_containers=inits
        )
        assert got.nodes == s.nodes and got.blocks == s.blocks
        # other pods' records are kept (unlike the kubelet), nothing is recorded for sidecars
        assert got.reusable == {"other": {(0,): {"memory": GB}}}
    regular = allocate(
        s,
        "pod1",
        "initContainer1",
        {"memory": GB},
        NO_AFFINITY,
        init_containers=[InitContainer("initContainer1")],
    )
    assert regular.reusable == {"other": {(0,): {"memory": GB}}, "pod1": {(0,): {"memory": GB}}}


def test_removing_the_pod_gives_back_everything() -> None:
    inits, apps, memory, hugepages, sizes, _, _ = CASES["init 4Gi and 3Gi, apps 2Gi and 1Gi"]
    start = one_node(memory, hugepages)
    s = run_pod(start, inits, apps)
    for name in sizes:
        s = remove(s, "pod1", name)
    assert s.nodes == start.nodes and s.blocks == {}
