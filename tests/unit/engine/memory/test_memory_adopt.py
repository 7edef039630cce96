"""Adopting blocks another Memory Manager gave a running container (the kubelet's
memory_manager_state): the same state ``allocate`` makes for them, or one line saying why not."""

from __future__ import annotations

import pytest
from mm_builders import GB, HP1G, MB, blocks, node, state, table

from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import MemoryAllocationError, adopt, allocate

REQUEST = {"cpu": 1, "memory": GB, HP1G: GB}
HP_FREE = table(GB, GB, 0, 0, GB)


def two_nodes():
    free = table(3 * GB, 3 * GB, 0, 512 * MB, 3 * GB + 512 * MB)
    return state({0: node([0], memory=free, hp1g=HP_FREE), 1: node([1], memory=free, hp1g=HP_FREE)})


@pytest.mark.parametrize("mask", [(0,), (1,), (0, 1)])
def test_adopting_what_allocate_gives_is_the_state_allocate_makes(mask):
    allocated = allocate(two_nodes(), "pod", "app", REQUEST, Hint(frozenset(mask), True))
    adopted = adopt(two_nodes(), "pod", "app", allocated.blocks["pod"]["app"], REQUEST)
    assert adopted.nodes == allocated.nodes and adopted.blocks == allocated.blocks


@pytest.mark.parametrize("given, why", [
    (blocks(((0,), "memory", GB)), "not one mask holding what the container asks for"),
    (blocks(((0,), "memory", GB), ((1,), HP1G, GB)), "not one mask"),
    (blocks(((0,), "memory", 2 * GB), ((0,), HP1G, GB)), "not one mask"),
    (blocks(((2,), "memory", GB), ((2,), HP1G, GB)), "NUMA nodes [2] are not this machine's"),
    (blocks(((0,), "memory", 4 * GB), ((0,), HP1G, GB)), "not one mask"),
])
def test_blocks_that_do_not_match_the_request_or_the_machine_are_refused(given, why):
    with pytest.raises(MemoryAllocationError, match=rf"^.*{why.replace('[', '.').replace(']', '.')}"):
        adopt(two_nodes(), "pod", "app", given, REQUEST)


def test_more_than_is_free_is_refused():
    big = {"memory": 4 * GB}
    with pytest.raises(MemoryAllocationError, match=r"NUMA nodes \[0\] have not that much free"):
        adopt(two_nodes(), "pod", "app", blocks(((0,), "memory", 4 * GB)), big)


def test_a_group_is_never_joined_by_a_node_used_alone():
    one_alone = allocate(two_nodes(), "a", "app", REQUEST, Hint(frozenset({0}), True))
    with pytest.raises(MemoryAllocationError, match="alone or in another group"):
        adopt(one_alone, "b", "app", blocks(((0, 1), "memory", GB), ((0, 1), HP1G, GB)), REQUEST)
    adopted = adopt(one_alone, "b", "app", blocks(((1,), "memory", GB), ((1,), HP1G, GB)), REQUEST)
    assert adopted.nodes[1].tables["memory"].reserved == GB


def test_a_container_that_holds_memory_already_is_refused():
    held = allocate(two_nodes(), "pod", "app", REQUEST, Hint(frozenset({0}), True))
    with pytest.raises(MemoryAllocationError, match="holds memory already"):
        adopt(held, "pod", "app", held.blocks["pod"]["app"], REQUEST)
