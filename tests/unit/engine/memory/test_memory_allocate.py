"""Allocate and remove (kubelet §5.4, §5.5): TestStaticPolicyAllocate,
TestStaticPolicyRemoveContainer and the multi-NUMA cases of memory_manager_test.go."""

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
from nri_numa.engine.memory import (
    MemoryAllocationError,
    MemoryState,
    MemoryStateError,
    allocate,
    remove,
)

GUARANTEED = {"cpu": 1, "memory": GB, HP1G: GB}
NO_AFFINITY = Hint(None, False)
NO_AFFINITY_PREFERRED = Hint(None, True)


def mask(*nodes: int, preferred: bool) -> Hint:
    return Hint(frozenset(nodes), preferred)


HP_FREE = table(GB, GB, 0, 0, GB)
HP_USED = table(GB, 0, GB, 0, GB)


def test_container_with_blocks_is_left_as_it_is() -> None:
    s = state(
        {0: node([0], 1, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_FREE)},
        {"pod1": {"container1": blocks(((0,), "memory", GB))}},
    )
    got = allocate(s, "pod1", "container1", GUARANTEED, NO_AFFINITY)
    assert got.nodes == s.nodes and got.blocks == s.blocks


def test_default_hint_when_the_topology_manager_gave_no_affinity() -> None:
    s = state(
        {0: node([0], 0, memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB), hp1g=HP_FREE)}
    )
    got = allocate(s, "pod1", "container1", GUARANTEED, NO_AFFINITY)
    assert_same_blocks(
        got, {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP1G, GB))}}
    )
    assert_same_machine(
        got,
        state(
            {0: node([0], 2, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_USED)}
        ),
    )


def test_default_hint_fails_when_no_node_has_room() -> None:
    s = state(
        {0: node([0], 2, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_USED)},
        {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP1G, GB))}},
    )
    with pytest.raises(
        MemoryAllocationError,
        match=r"^\[memorymanager\] failed to get the default NUMA "
        r"affinity, no NUMA nodes with enough memory is available$",
    ):
        allocate(s, "pod2", "container2", GUARANTEED, NO_AFFINITY)


def _node0_used_alone_and_two_small() -> MemoryState:
    return state(
        {
            0: node(
                [0], 1, memory=table(GB, 512 * MB, 512 * MB, 512 * MB, 1536 * MB), hp1g=HP_FREE
            ),
            1: node([1], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB), hp1g=HP_FREE),
            2: node([2], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB), hp1g=HP_FREE),
        },
        {"pod1": {"container1": blocks(((0,), "memory", 512 * MB))}},
    )


def test_default_hint_must_be_preferred_when_the_topology_manager_hint_was() -> None:
    with pytest.raises(
        MemoryAllocationError,
        match=r"^\[memorymanager\] failed to find the default preferred hint$",
    ):
        allocate(
            _node0_used_alone_and_two_small(),
            "pod2",
            "container2",
            GUARANTEED,
            NO_AFFINITY_PREFERRED,
        )


def test_default_hint_may_be_non_preferred_when_the_topology_manager_hint_was_too() -> None:
    got = allocate(_node0_used_alone_and_two_small(), "pod2", "container2", GUARANTEED, NO_AFFINITY)
    assert got.container_blocks("pod2", "container2") == blocks(
        ((1, 2), HP1G, GB), ((1, 2), "memory", GB)
    )
    assert got.nodes[1].cells == got.nodes[2].cells == (1, 2)


def test_extension_fails_when_no_hint_holds_the_given_mask() -> None:
    s = state(
        {
            0: node([0], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, GB), hp1g=HP_FREE),
            1: node(
                [1, 2], 1, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_FREE
            ),
            2: node(
                [1, 2], 1, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_FREE
            ),
        }
    )
    with pytest.raises(
        MemoryAllocationError,
        match=r"^\[memorymanager\] failed to find NUMA nodes to "
        r"extend the current topology hint$",
    ):
        allocate(s, "pod1", "container1", GUARANTEED, mask(0, preferred=False))


def test_extended_hint_must_be_preferred_when_the_given_one_was() -> None:
    with pytest.raises(
        MemoryAllocationError,
        match=r"^\[memorymanager\] failed to find the extended preferred hint$",
    ):
        allocate(
            _node0_used_alone_and_two_small(),
            "pod2",
            "container2",
            GUARANTEED,
            mask(1, preferred=True),
        )


def test_narrowed_hint_is_extended_to_the_best_mask_holding_it() -> None:
    s = state({i: node([i], 0, memory=table(GB, GB, 0, 0, GB)) for i in range(3)})
    got = allocate(s, "pod", "c", {"memory": 1536 * MB}, mask(1, preferred=False))
    assert got.container_blocks("pod", "c") == blocks(((0, 1), "memory", 1536 * MB))
    assert (
        got.nodes[0].tables["memory"].free == 0 and got.nodes[1].tables["memory"].free == 512 * MB
    )


def _four_small_nodes() -> MemoryState:
    return state(
        {
            i: node([i], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, GB), hp1g=HP_FREE)
            for i in range(4)
        }
    )


def test_allocation_over_several_nodes_groups_them() -> None:
    # kubelet "should succeed to allocate memory from multiple NUMA nodes"
    got = allocate(_four_small_nodes(), "pod1", "container1", GUARANTEED, NO_AFFINITY_PREFERRED)
    assert_same_blocks(
        got, {"pod1": {"container1": blocks(((0, 1), "memory", GB), ((0, 1), HP1G, GB))}}
    )
    mem_used = table(512 * MB, 0, 512 * MB, 512 * MB, GB)
    assert_same_machine(
        got,
        state(
            {
                0: node([0, 1], 2, memory=mem_used, hp1g=HP_USED),
                1: node([0, 1], 2, memory=mem_used, hp1g=HP_FREE),
                2: node([2], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, GB), hp1g=HP_FREE),
                3: node([3], 0, memory=table(512 * MB, 512 * MB, 0, 512 * MB, GB), hp1g=HP_FREE),
            }
        ),
    )
    # the spill is in ascending node order, so the exact split is known too
    assert got.nodes[0].tables[HP1G].free == 0 and got.nodes[1].tables[HP1G].free == GB


def _two_big_nodes(node0: object | None = None) -> MemoryState:
    empty = node(
        [1],
        0,
        memory=table(9 * GB, 9 * GB, 0, GB, 10 * GB),
        hp1g=table(5 * GB, 5 * GB, 0, 0, 5 * GB),
    )
    return state(
        {
            0: node0
            or node(
                [0],
                0,
                memory=table(9 * GB, 9 * GB, 0, GB, 10 * GB),
                hp1g=table(5 * GB, 5 * GB, 0, 0, 5 * GB),
            ),
            1: empty,
        }
    )


BIG = {"memory": 12 * GB, HP1G: 4 * GB}


def test_request_larger_than_one_node_spills_over_the_group() -> None:
    # memory_manager_test "Correct allocation of container requiring amount of memory higher
    # than capacity of one NUMA node"
    got = allocate(_two_big_nodes(), "fakePod1", "fakeContainer1", BIG, NO_AFFINITY)
    assert_same_machine(
        got,
        state(
            {
                0: node(
                    [0, 1],
                    2,
                    memory=table(9 * GB, 0, 9 * GB, GB, 10 * GB),
                    hp1g=table(5 * GB, GB, 4 * GB, 0, 5 * GB),
                ),
                1: node(
                    [0, 1],
                    2,
                    memory=table(9 * GB, 6 * GB, 3 * GB, GB, 10 * GB),
                    hp1g=table(5 * GB, 5 * GB, 0, 0, 5 * GB),
                ),
            }
        ),
    )


def test_node_used_alone_cannot_join_a_group() -> None:
    # memory_manager_test "Should fail if try to allocate container requiring amount of memory
    # higher than capacity of one NUMA node but a small pod is already allocated"
    used = node(
        [0],
        2,
        memory=table(9 * GB, 8 * GB, GB, GB, 10 * GB),
        hp1g=table(5 * GB, 4 * GB, GB, 0, 5 * GB),
    )
    with pytest.raises(MemoryAllocationError, match="failed to get the default NUMA affinity"):
        allocate(_two_big_nodes(used), "fakePod2", "fakeContainer2", BIG, NO_AFFINITY)


def test_hint_that_breaks_a_group_is_refused() -> None:
    used = node(
        [0],
        2,
        memory=table(9 * GB, 8 * GB, GB, GB, 10 * GB),
        hp1g=table(5 * GB, 4 * GB, GB, 0, 5 * GB),
    )
    with pytest.raises(
        MemoryAllocationError,
        match=r"^\[memorymanager\] preferred hint violates NUMA node allocation$",
    ):
        allocate(_two_big_nodes(used), "p", "c", BIG, mask(0, 1, preferred=False))


def test_grouped_node_is_used_again_only_with_its_whole_group() -> None:
    s = allocate(_two_big_nodes(), "p1", "c1", BIG, NO_AFFINITY)
    again = allocate(s, "p2", "c2", {"memory": 3 * GB}, mask(0, 1, preferred=False))
    assert again.nodes[1].tables["memory"].free == 3 * GB and again.nodes[0].assignments == 3
    wider = state(
        {**s.nodes, 2: node([2], 0, memory=table(9 * GB, 9 * GB, 0, 0, 9 * GB))}, s.blocks
    )
    with pytest.raises(MemoryAllocationError, match="violates NUMA node allocation"):
        allocate(wider, "p2", "c2", {"memory": GB}, mask(0, 1, 2, preferred=False))


def test_single_node_hint_on_a_grouped_node_is_extended_to_its_group() -> None:
    # The kubelet checks groups at allocation only for multi-node masks, so it would take node 1
    # alone here (memory hints never offer it, but a best-effort merge with other providers
    # can) and leave node 1 both grouped and used alone. This engine extends it to the group.
    s = allocate(_two_big_nodes(), "p1", "c1", BIG, NO_AFFINITY)
    single = allocate(s, "p3", "c3", {"memory": GB}, mask(1, preferred=False))
    assert single.container_blocks("p3", "c3") == blocks(((0, 1), "memory", GB))
    assert single.nodes[1].cells == single.nodes[0].cells == (0, 1)
    with pytest.raises(MemoryAllocationError, match="failed to find the extended preferred hint"):
        allocate(s, "p3", "c3", {"memory": GB}, mask(1, preferred=True))


def test_hint_naming_an_unknown_node_is_refused() -> None:
    with pytest.raises(MemoryAllocationError, match=r"NUMA nodes \[7\]"):
        allocate(_four_small_nodes(), "p", "c", {"memory": MB}, mask(7, preferred=True))


def test_resource_missing_on_a_node_of_the_mask_is_refused() -> None:
    s = state(
        {
            0: node([0], 0, memory=table(GB, GB, 0, 0, GB)),
            1: node([1], 0, memory=table(GB, GB, 0, 0, GB), hp1g=table(GB, GB, 0, 0, GB)),
        }
    )
    with pytest.raises(MemoryAllocationError, match=r"NUMA node 0 has no hugepages-1Gi"):
        allocate(s, "p", "c", {"memory": GB, HP1G: GB}, mask(0, 1, preferred=False))
    got = allocate(s, "p", "c", {"memory": GB, HP1G: GB}, NO_AFFINITY)
    assert got.container_blocks("p", "c") == blocks(((1,), HP1G, GB), ((1,), "memory", GB))


def test_request_without_memory_resources_changes_nothing() -> None:
    s = _four_small_nodes()
    assert allocate(s, "p", "c", {"cpu": 2}, NO_AFFINITY) == s


# --- remove ---------------------------------------------------------------------------------


def test_remove_unknown_container_changes_nothing() -> None:
    s = state(
        {0: node([0], 0, memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB), hp1g=HP_FREE)}
    )
    assert remove(s, "pod1", "container1") is s


def test_remove_releases_the_memory() -> None:
    s = state(
        {0: node([0], 2, memory=table(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB), hp1g=HP_USED)},
        {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP1G, GB))}},
    )
    got = remove(s, "pod1", "container1")
    assert got.blocks == {}
    assert got.nodes[0] == node(
        [0], 0, memory=table(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB), hp1g=HP_FREE
    )


def test_remove_of_a_cross_numa_container_dissolves_the_group() -> None:
    mem_used = table(512 * MB, 0, 512 * MB, 512 * MB, GB)
    s = state(
        {
            0: node([0, 1], 2, memory=mem_used, hp1g=HP_USED),
            1: node([0, 1], 2, memory=mem_used, hp1g=HP_FREE),
        },
        {"pod1": {"container1": blocks(((0, 1), "memory", GB), ((0, 1), HP1G, GB))}},
    )
    got = remove(s, "pod1", "container1")
    free = table(512 * MB, 512 * MB, 0, 512 * MB, GB)
    assert got.nodes == {
        0: node([0], 0, memory=free, hp1g=HP_FREE),
        1: node([1], 0, memory=free, hp1g=HP_FREE),
    }


def test_remove_keeps_the_group_while_others_use_it() -> None:
    # memory_manager_test "Correct removing of a multi NUMA container"
    s = state(
        {
            0: node(
                [0, 1],
                4,
                memory=table(9 * GB, 0, 9 * GB, GB, 10 * GB),
                hp1g=table(5 * GB, 3 * GB, 2 * GB, 0, 5 * GB),
            ),
            1: node(
                [0, 1],
                4,
                memory=table(9 * GB, 5 * GB, 4 * GB, GB, 10 * GB),
                hp1g=table(5 * GB, 5 * GB, 0, 0, 5 * GB),
            ),
        },
        {
            "fakePod1": {
                "fakeContainer1": blocks(((0, 1), "memory", GB), ((0, 1), HP1G, GB)),
                "fakeContainer2": blocks(((0, 1), "memory", 12 * GB), ((0, 1), HP1G, GB)),
            }
        },
    )
    got = remove(s, "fakePod1", "fakeContainer2")
    assert_same_blocks(
        got, {"fakePod1": {"fakeContainer1": blocks(((0, 1), "memory", GB), ((0, 1), HP1G, GB))}}
    )
    assert_same_machine(
        got,
        state(
            {
                0: node(
                    [0, 1],
                    2,
                    memory=table(9 * GB, 9 * GB, 0, GB, 10 * GB),
                    hp1g=table(5 * GB, 4 * GB, GB, 0, 5 * GB),
                ),
                1: node(
                    [0, 1],
                    2,
                    memory=table(9 * GB, 8 * GB, GB, GB, 10 * GB),
                    hp1g=table(5 * GB, 5 * GB, 0, 0, 5 * GB),
                ),
            }
        ),
    )


def test_remove_of_a_block_the_state_cannot_hold_is_an_error() -> None:
    s = state(
        {0: node([0], 1, memory=table(GB, GB, 0, 0, GB))},
        {"p": {"c": blocks(((0, 3), "memory", GB))}},
    )
    with pytest.raises(
        MemoryStateError, match=r"\(pod: p, container: c\) holds memory on NUMA nodes \[0, 3\]"
    ):
        remove(s, "p", "c")
