"""The faster memory hints give exactly the plain walk's hints, and states derived by allocation
equal the ones the constructor builds.

``plain_memory_hints`` is the straightforward form of the rule (§5.3 of
docs/kubelet-algorithms.md): walk every mask in kubelet order, sum allocatable and free memory
over its nodes, keep it when it could ever fit, respects the groups and fits now (or with what
this pod's init containers left). The engine's version keeps per-machine work with the state's
capacity and filters whole lists; the states compared here come from random sequences of real
allocations, removals and init containers on machines with sparse node ids and hugepages.
"""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.bitmask import bits, iterate_masks
from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import (
    InitContainer,
    MemoryAllocationError,
    MemoryState,
    MemoryTable,
    NodeState,
    allocate,
    memory_hints,
    remove,
)
from nri_numa.engine.memory.resources import requested_resources

GIB = 1 << 30
HP1G = "hugepages-1Gi"
SEEDS = range(40)


def plain_memory_hints(state: MemoryState, pod_id: str, request) -> dict[str, list[Hint]]:
    request = requested_resources(request)
    node_ids = list(state.nodes)
    resources = sorted(request)

    def total(mask: tuple[int, ...], resource: str, field: str) -> int:
        return sum(getattr(state.nodes[n].tables[resource], field) for n in mask
                   if resource in state.nodes[n].tables)

    def respects_groups(mask: tuple[int, ...]) -> bool:
        if len(mask) == 1:
            return len(state.nodes[mask[0]].cells) == 1
        return all(state.nodes[n].assignments == 0 or state.nodes[n].cells == mask for n in mask)

    reusable = state.reusable.get(pod_id, {})
    fitting, min_affinity = [], len(node_ids)
    for ids in iterate_masks(node_ids):
        mask = tuple(bits(ids))
        if any(total(mask, r, "allocatable") < request[r] for r in resources):
            continue
        min_affinity = min(min_affinity, len(mask))
        if not respects_groups(mask):
            continue
        left = reusable.get(mask, {})
        fits_now = all(total(mask, r, "free") >= request[r] for r in resources)
        fits_with_reuse = mask in reusable and all(
            total(mask, r, "free") + left.get(r, 0) >= request[r] for r in resources)
        if fits_now or fits_with_reuse:
            fitting.append(mask)
    hints = [Hint(mask, len(mask) == min_affinity) for mask in fitting]
    return {r: list(hints) for r in resources} if hints else {}


def random_machine(rng: random.Random) -> MemoryState:
    ids = sorted(rng.sample(range(8), rng.randint(1, 5)))
    with_hugepages = rng.random() < 0.5
    nodes = {}
    for n in ids:
        memory = rng.randint(4, 24) * GIB
        tables = {"memory": MemoryTable(memory, 0, memory, 0, memory)}
        if with_hugepages and rng.random() < 0.8:  # some nodes lack the size
            pages = rng.randint(0, 8) * GIB
            tables[HP1G] = MemoryTable(pages, 0, pages, 0, pages)
        nodes[n] = NodeState(tables=tables, cells=(n,))
    return MemoryState(nodes)


def random_request(rng: random.Random) -> dict[str, int]:
    request = {"memory": rng.randint(1, 30) * GIB // 2}
    if rng.random() < 0.4:
        request[HP1G] = rng.randint(0, 6) * GIB
    return request


def random_hint(rng: random.Random, state: MemoryState) -> Hint:
    if rng.random() < 0.2:
        return Hint(None, rng.random() < 0.5)
    ids = list(state.nodes)
    return Hint(rng.sample(ids, rng.randint(1, len(ids))), rng.random() < 0.5)


def random_states(rng: random.Random, steps: int = 12) -> list[MemoryState]:
    """A machine, then what real allocations and removals made of it, step by step."""
    states = [random_machine(rng)]
    inits = [InitContainer("init-a"), InitContainer("side", restartable=True)]
    placed: list[tuple[str, str]] = []
    for step in range(steps):
        state = states[-1]
        if placed and rng.random() < 0.25:
            pod, name = placed.pop(rng.randrange(len(placed)))
            states.append(remove(state, pod, name))
            continue
        pod = f"pod-{rng.randrange(4)}"
        name = rng.choice(["init-a", "side", f"app-{step}"])
        try:
            state = allocate(state, pod, name, random_request(rng), random_hint(rng, state),
                             init_containers=inits)
        except MemoryAllocationError:
            continue
        placed.append((pod, name))
        states.append(state)
    return states


@pytest.mark.parametrize("seed", SEEDS)
def test_hints_match_the_plain_walk(seed):
    rng = random.Random(seed)
    for state in random_states(rng):
        for pod in ("pod-0", "pod-1", "pod-9"):
            for _ in range(3):
                request = random_request(rng)
                assert memory_hints(state, pod, request) == plain_memory_hints(state, pod, request)


def test_some_random_states_exercise_groups_and_reuse():
    """The walk above sees the cases the fast filters treat apart (else it proves little)."""
    states = [s for seed in SEEDS for s in random_states(random.Random(seed))]
    nodes = [node for s in states for node in s.nodes.values()]
    assert any(len(node.cells) > 1 and node.assignments for node in nodes)
    assert any(len(node.cells) == 1 and node.assignments for node in nodes)
    assert any(s.reusable for s in states)
    assert any(list(s.nodes) != list(range(len(s.nodes))) for s in states)


@pytest.mark.parametrize("seed", SEEDS)
def test_derived_states_equal_the_constructed_ones(seed):
    for state in random_states(random.Random(seed)):
        rebuilt = MemoryState(state.nodes, state.blocks, state.reusable)
        assert state == rebuilt
        assert state.to_dict() == rebuilt.to_dict()
        assert list(state.nodes) == list(rebuilt.nodes)
        pairs = zip(state.blocks.values(), rebuilt.blocks.values(), strict=True)
        assert all(type(mine) is type(theirs) for mine, theirs in pairs)


def test_derived_states_share_the_machine_capacity():
    state = random_machine(random.Random(1))
    capacity = state.capacity
    after = allocate(state, "p", "c", {"memory": GIB}, Hint(None, False))
    assert after.capacity is capacity
    assert remove(after, "p", "c").capacity is capacity


def test_hints_match_the_plain_walk_past_the_kept_width():
    """Ten nodes: past the width whose fitting masks the capacity keeps, computed afresh."""
    rng = random.Random(5)
    nodes = {}
    for n in range(10):
        memory = rng.randint(2, 8) * GIB
        nodes[n] = NodeState(tables={"memory": MemoryTable(memory, 0, memory, 0, memory)},
                             cells=(n,))
    state = allocate(MemoryState(nodes), "p", "a", {"memory": 9 * GIB}, Hint({0, 1, 2}, False))
    for request in ({"memory": GIB}, {"memory": 12 * GIB}, {"memory": 80 * GIB}):
        assert memory_hints(state, "q", request) == plain_memory_hints(state, "q", request)
