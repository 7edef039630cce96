"""Memory hints (kubelet §5.3): TestStaticPolicyGetTopologyHints and the rules behind it."""

from __future__ import annotations

import time

import pytest
from mm_builders import GB, HP1G, HP2M, MB, blocks, node, state, table

from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import (
    MemoryState,
    best_hint,
    container_hints,
    memory_hints,
    pod_hints,
    regenerate_hints,
)

GUARANTEED = {"cpu": 1000, "memory": GB, HP1G: GB}


def hint(*nodes: int, preferred: bool) -> Hint:
    return Hint(frozenset(nodes), preferred)


def free_node(i: int, memory: int = 1536 * MB, hugepages: int = GB) -> tuple[int, object]:
    return i, node(
        [i],
        0,
        memory=table(memory, memory, 0, 512 * MB, memory + 512 * MB),
        hp1g=table(hugepages, hugepages, 0, 0, hugepages),
    )


def test_existing_assignment_regenerates_its_hints() -> None:
    s = state({}, {"pod1": {"container1": blocks(((0,), "memory", GB), ((0,), HP1G, GB))}})
    assert container_hints(s, "pod1", "container1", GUARANTEED) == {
        "memory": [hint(0, preferred=True)],
        HP1G: [hint(0, preferred=True)],
    }


@pytest.mark.parametrize(
    "existing",
    [
        blocks(((0,), "memory", GB)),  # fewer blocks than resources
        blocks(((0,), "memory", GB), ((0,), HP2M, GB)),  # a resource not requested
        blocks(((0,), "memory", 512 * MB), ((0,), HP1G, GB)),  # a different size
    ],
)
def test_existing_assignment_that_no_longer_matches_gives_no_preference(existing: tuple) -> None:
    s = state({}, {"pod1": {"container1": existing}})
    assert container_hints(s, "pod1", "container1", GUARANTEED) is None


def _grouped_pair_and_two_free() -> MemoryState:
    hp_used = table(GB, 0, GB, 0, GB)
    return state(
        {
            0: node(
                [0, 1], 2, memory=table(1536 * MB, 0, 1536 * MB, 512 * MB, 2 * GB), hp1g=hp_used
            ),
            1: node(
                [0, 1], 2, memory=table(1536 * MB, GB, 512 * MB, 512 * MB, 2 * GB), hp1g=hp_used
            ),
            **dict([free_node(2), free_node(3)]),
        },
        {"pod1": {"container1": blocks(((0, 1), "memory", 2 * GB), ((0, 1), HP1G, 2 * GB))}},
    )


def test_new_container_hints_avoid_grouped_nodes() -> None:
    # kubelet "should calculate new topology hints, when the container does not exist"
    want = [hint(2, preferred=True), hint(3, preferred=True), hint(2, 3, preferred=False)]
    assert container_hints(_grouped_pair_and_two_free(), "pod2", "container2", GUARANTEED) == {
        "memory": want,
        HP1G: want,
    }


def test_group_is_offered_again_but_not_preferred_when_one_node_would_do() -> None:
    # kubelet "should not return preferred hints with multiple NUMA nodes for the pod with
    # resources satisfied by a single NUMA node"
    s = state(
        {
            0: node(
                [0, 1],
                2,
                memory=table(1536 * MB, 0, 1536 * MB, 512 * MB, 2 * GB),
                hp2m=table(20 * MB, 0, 20 * MB, 0, 20 * MB),
            ),
            1: node(
                [0, 1],
                2,
                memory=table(1536 * MB, GB, 512 * MB, 512 * MB, 2 * GB),
                hp2m=table(20 * MB, 16 * MB, 4 * MB, 0, 20 * MB),
            ),
        },
        {"pod1": {"container1": blocks(((0, 1), "memory", 2 * GB), ((0, 1), HP2M, 24 * MB))}},
    )
    got = container_hints(s, "pod2", "container2", {"memory": GB, HP2M: 16 * MB})
    assert got == {"memory": [hint(0, 1, preferred=False)], HP2M: [hint(0, 1, preferred=False)]}


def test_all_masks_in_iteration_order_with_the_narrowest_preferred() -> None:
    s = state(dict(free_node(i, memory=GB) for i in range(3)))
    got = memory_hints(s, "pod", {"memory": GB})
    assert got == {
        "memory": [
            hint(0, preferred=True),
            hint(1, preferred=True),
            hint(2, preferred=True),
            hint(0, 1, preferred=False),
            hint(0, 2, preferred=False),
            hint(1, 2, preferred=False),
            hint(0, 1, 2, preferred=False),
        ]
    }


def test_min_affinity_is_measured_on_allocatable_not_free() -> None:
    # Node 0 could hold 1Gi on its own if it were empty, so two-node hints are not preferred
    # even though no single node has 1Gi free right now.
    s = state(
        {
            0: node([0], 1, memory=table(GB, 512 * MB, 512 * MB, 0, GB)),
            1: node([1], 0, memory=table(512 * MB, 512 * MB, 0, 0, GB)),
            2: node([2], 0, memory=table(512 * MB, 512 * MB, 0, 0, GB)),
        },
        {"p": {"c": blocks(((0,), "memory", 512 * MB))}},
    )
    # {0,1} and {0,2} are out: node 0 is used on its own
    assert memory_hints(s, "pod", {"memory": GB}) == {"memory": [hint(1, 2, preferred=False)]}


def test_no_mask_fits_gives_an_empty_map() -> None:
    s = state(dict(free_node(i, memory=GB) for i in range(2)))
    assert memory_hints(s, "pod", {"memory": 3 * GB}) == {}


def test_hugepages_size_the_node_lacks_counts_as_none() -> None:
    s = state({0: node([0], 0, memory=table(GB, GB, 0, 0, GB))})
    assert memory_hints(s, "pod", {"memory": MB, HP1G: GB}) == {}
    assert memory_hints(s, "pod", {"memory": MB, HP1G: 0}) == {
        "memory": [hint(0, preferred=True)],
        HP1G: [hint(0, preferred=True)],
    }


def test_memory_left_by_the_pods_init_containers_counts_as_free_on_its_mask() -> None:
    s = state(
        {
            0: node([0], 1, memory=table(2 * GB, GB, GB, 0, 2 * GB)),
            1: node([1], 0, memory=table(2 * GB, 2 * GB, 0, 0, 2 * GB)),
        },
        {"pod": {"init": blocks(((0,), "memory", GB))}},
        {"pod": {(0,): {"memory": GB}}},
    )
    request = {"memory": 2 * GB}
    assert memory_hints(s, "pod", request)["memory"][:2] == [
        hint(0, preferred=True),
        hint(1, preferred=True),
    ]
    # another pod cannot reuse it
    assert memory_hints(s, "other", request)["memory"][:1] == [hint(1, preferred=True)]


def test_pod_hints_regenerate_from_the_first_container_with_blocks() -> None:
    s = state(
        {},
        {
            "pod": {
                "app": blocks(((1,), "memory", 2 * GB)),
                "init": blocks(((0,), "memory", 2 * GB)),
            }
        },
    )
    assert pod_hints(s, "pod", ["init", "app"], {"memory": 2 * GB}) == {
        "memory": [hint(0, preferred=True)]
    }
    assert pod_hints(s, "pod", ["other", "app"], {"memory": 2 * GB}) == {
        "memory": [hint(1, preferred=True)]
    }
    assert pod_hints(s, "pod", ["init"], {"memory": 3 * GB}) is None


def test_pod_hints_without_blocks_calculate() -> None:
    s = _grouped_pair_and_two_free()
    assert pod_hints(s, "pod2", ["a", "b"], {"memory": 3 * GB})["memory"] == [
        hint(2, 3, preferred=True)
    ]


def test_regenerate_hints_of_an_empty_allocation() -> None:
    assert regenerate_hints((), {}) == {}


@pytest.mark.parametrize(
    "hints, best",
    [
        ([], None),
        ([hint(0, 1, preferred=False), hint(2, preferred=False)], hint(2, preferred=False)),
        ([hint(0, preferred=False), hint(1, 2, preferred=True)], hint(1, 2, preferred=True)),
        # equal size: the smaller mask as an integer ({1,2}=6 beats {0,3}=9)
        ([hint(0, 3, preferred=True), hint(1, 2, preferred=True)], hint(1, 2, preferred=True)),
        ([hint(1, preferred=True), hint(0, preferred=True)], hint(0, preferred=True)),
        ([hint(1, preferred=True), hint(1, preferred=True)], hint(1, preferred=True)),
    ],
)
def test_best_hint(hints: list[Hint], best: Hint | None) -> None:
    assert best_hint(hints) == best


def test_hint_generation_is_fast_up_to_eight_nodes_and_works_past_them() -> None:
    eight = state(dict(free_node(i) for i in range(8)))
    start = time.perf_counter()
    for _ in range(20):
        hints = memory_hints(eight, "pod", {"memory": 4 * GB, HP1G: 3 * GB})
    per_call = (time.perf_counter() - start) / 20
    assert len(hints["memory"]) == 255 - 8 - 28  # every mask of 3 nodes or more
    assert sum(h.preferred for h in hints["memory"]) == 56  # the 3-node masks
    # A guard against an exponential search, far from the few ms a call takes (bench_merge).
    assert per_call < 1.0, f"{per_call * 1000:.1f} ms for 8 nodes"
    twelve = state(dict(free_node(i) for i in range(12)))
    assert len(memory_hints(twelve, "pod", {"memory": 10 * 1536 * MB})["memory"]) == 79
