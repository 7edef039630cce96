"""Short builders for Memory Manager states, so cases read like the kubelet's test tables."""

from __future__ import annotations

from nri_numa.engine.memory import (
    Block,
    MemoryState,
    MemoryTable,
    NodeState,
    machine_state_difference,
)

MB = 1024**2
GB = 1024**3
HP1G = "hugepages-1Gi"
HP2M = "hugepages-2Mi"


def table(
    allocatable: int, free: int, reserved: int, system_reserved: int, total: int
) -> MemoryTable:
    """Arguments in the order the kubelet's tests write them."""
    return MemoryTable(
        total=total,
        system_reserved=system_reserved,
        allocatable=allocatable,
        reserved=reserved,
        free=free,
    )


def node(
    cells: tuple[int, ...] | list[int], assignments: int = 0, **tables: MemoryTable
) -> NodeState:
    """``memory=``, ``hp1g=``, ``hp2m=`` name the tables."""
    names = {"memory": "memory", "hp1g": HP1G, "hp2m": HP2M}
    return NodeState(
        tables={names[k]: v for k, v in tables.items()}, cells=tuple(cells), assignments=assignments
    )


def blocks(*triples: tuple[tuple[int, ...], str, int]) -> tuple[Block, ...]:
    return tuple(Block(tuple(a), t, s) for a, t, s in triples)


def state(
    nodes: dict[int, NodeState], entries: dict | None = None, reusable: dict | None = None
) -> MemoryState:
    return MemoryState(nodes=nodes, blocks=entries or {}, reusable=reusable or {})


def assert_same_machine(actual: MemoryState, expected: MemoryState) -> None:
    """The kubelet's areMachineStatesEqual, with the difference in the failure message."""
    difference = machine_state_difference(actual.nodes, expected.nodes)
    assert difference is None, difference


def assert_same_blocks(actual: MemoryState, expected: dict) -> None:
    """Assignments equal per container, blocks compared as multisets (as the kubelet does)."""
    got = {
        pod: {name: sorted(bs, key=repr) for name, bs in containers.items()}
        for pod, containers in actual.blocks.items()
    }
    want = {
        pod: {name: sorted(bs, key=repr) for name, bs in containers.items()}
        for pod, containers in expected.items()
    }
    assert got == want
