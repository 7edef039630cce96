"""Property tests: random machines and random sequences of allocations and removals."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import (
    InitContainer,
    MemoryAllocationError,
    MemoryState,
    allocate,
    machine_state_difference,
    memory_hints,
    remove,
)
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import HugePages, NumaNode

MB = 1024**2
HP2M = "hugepages-2Mi"


@st.composite
def machines(draw: st.DrawFn) -> MemoryState:
    count = draw(st.integers(1, 4))
    nodes = []
    reserved = {}
    for i in range(count):
        pages = draw(st.integers(0, 64))
        memory = draw(st.integers(pages * 2 + 64, 4096)) * MB
        nodes.append(
            NumaNode(
                id=i,
                cpus=frozenset(),
                memory_bytes=memory,
                hugepages={2048: HugePages(total=pages, free=pages)},
            )
        )
        reserved[i] = {"memory": draw(st.integers(0, 64)) * MB}
    return MemoryState.from_topology(Topology(cpus=(), numa_nodes=tuple(nodes)), reserved)


requests = st.fixed_dictionaries(
    {"memory": st.integers(1, 3000).map(lambda m: m * MB)},
    optional={HP2M: st.integers(0, 64).map(lambda p: p * 2 * MB)},
)


@st.composite
def hints(draw: st.DrawFn, node_count: int) -> Hint:
    if draw(st.booleans()):
        return Hint(None, draw(st.booleans()))
    nodes = draw(st.sets(st.integers(0, node_count - 1), min_size=1))
    return Hint(frozenset(nodes), draw(st.booleans()))


operations = st.lists(
    st.tuples(st.sampled_from(["allocate", "remove"]), st.integers(0, 5), requests, st.data()),
    max_size=12,
)


def check_invariants(s: MemoryState) -> None:
    for node_id, node in s.nodes.items():
        assert node_id in node.cells and node.assignments >= 0
        for table in node.tables.values():
            assert (
                min(
                    table.total,
                    table.system_reserved,
                    table.allocatable,
                    table.reserved,
                    table.free,
                )
                >= 0
            )
            assert table.free + table.reserved == table.allocatable
        # every node of a group agrees on the group
        for other in node.cells:
            if node.assignments and s.nodes[other].assignments:
                assert s.nodes[other].cells == node.cells
    used = {}
    for containers in s.blocks.values():
        for bs in containers.values():
            for b in bs:
                for n in b.numa_affinity:
                    used[n] = used.get(n, 0) + 1
    assert used == {n: node.assignments for n, node in s.nodes.items() if node.assignments}


def run(start: MemoryState, ops: list) -> MemoryState:
    s = start
    for kind, container, request, data in ops:
        name = f"c{container}"
        if kind == "remove":
            s = remove(s, "pod", name)
        else:
            hint = data.draw(hints(len(s.nodes)))
            try:
                s = allocate(s, "pod", name, request, hint)
            except MemoryAllocationError:
                continue
        check_invariants(s)
        s.validate(start)  # replaying the blocks gives the same machine
    return s


@settings(max_examples=150, deadline=None)
@given(machines(), operations)
def test_random_sequences_keep_the_books_straight(start: MemoryState, ops: list) -> None:
    run(start, ops)


@settings(max_examples=150, deadline=None)
@given(machines(), operations, requests, st.data())
def test_allocate_then_remove_restores_the_state(
    start: MemoryState, ops: list, request: dict, data: st.DataObject
) -> None:
    before = run(start, ops)
    try:
        during = allocate(before, "new-pod", "new", request, data.draw(hints(len(before.nodes))))
    except MemoryAllocationError:
        return
    after = remove(during, "new-pod", "new")
    assert after.blocks == before.blocks
    assert machine_state_difference(after.nodes, before.nodes) is None
    # where the new container had its group to itself, even the per-node split is restored
    (mask,) = {b.numa_affinity for b in during.container_blocks("new-pod", "new")}
    if all(before.nodes[n].assignments == 0 for n in mask):
        assert after.nodes == before.nodes


@settings(max_examples=100, deadline=None)
@given(machines(), requests)
def test_a_hint_the_engine_offers_can_be_allocated(start: MemoryState, request: dict) -> None:
    for hint in memory_hints(start, "pod", request).get("memory", []):
        s = allocate(start, "pod", "c", request, hint)
        assert s.container_blocks("pod", "c")[0].numa_affinity == tuple(sorted(hint.affinity))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 2000)), min_size=1, max_size=4),
    st.lists(st.integers(0, 2000), min_size=1, max_size=3),
)
def test_init_container_blocks_add_up_to_what_the_pod_holds(inits: list, apps: list) -> None:
    one = MemoryState.from_topology(
        Topology(
            cpus=(), numa_nodes=(NumaNode(id=0, cpus=frozenset(), memory_bytes=64 * 1024 * MB),)
        ),
        {0: {"memory": MB}},
    )
    init_containers = [
        InitContainer(f"init{i}", restartable) for i, (restartable, _) in enumerate(inits)
    ]
    s = one
    for container, (_, size) in zip(init_containers, inits, strict=False):
        s = allocate(
            s,
            "pod",
            container.name,
            {"memory": size * MB},
            Hint(None, False),
            init_containers=init_containers,
        )
    for i, size in enumerate(apps):
        s = allocate(
            s,
            "pod",
            f"app{i}",
            {"memory": size * MB},
            Hint(None, False),
            init_containers=init_containers,
        )
    check_invariants(s)
    held = sum(b.size for bs in s.blocks["pod"].values() for b in bs)
    assert held == s.nodes[0].tables["memory"].reserved
    s.validate(one)
