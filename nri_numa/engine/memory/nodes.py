"""Per-NUMA-node memory bookkeeping: each node's tables, and the arithmetic over a map of nodes.

Kept apart from state.py, which holds the machine's ``MemoryState`` (the pods' blocks and
reusable memory, the default state, validation, the JSON form): nothing here knows of pods.
``MemoryTable`` is one resource's memory on one node; ``NodeState`` a node's tables, its group
(``cells``) and its number of assignments; ``MachineCapacity`` what no allocation changes;
``reserve_on``/``release_on`` spill a block over a group of nodes (shared by allocate, remove
and validate); ``machine_state_difference`` is the kubelet's comparison of two node maps.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from nri_numa.engine.bitmask import kubelet_order, subset_sums

Mask = tuple[int, ...]  # NUMA node ids, ascending


@dataclass(frozen=True, slots=True)
class MemoryTable:
    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int

    def take(self, amount: int) -> MemoryTable:
        return MemoryTable(self.total, self.system_reserved, self.allocatable,
                           self.reserved + amount, self.free - amount)

    def give_back(self, amount: int) -> MemoryTable:
        return MemoryTable(self.total, self.system_reserved, self.allocatable,
                           self.reserved - amount, self.free + amount)


# Not slots: _node uses the instance's __dict__.
@dataclass(frozen=True)
class NodeState:
    tables: Mapping[str, MemoryTable]  # resource → table
    cells: Mask
    assignments: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", MappingProxyType(dict(self.tables)))
        object.__setattr__(self, "cells", tuple(sorted(self.cells)))


_KEPT_WIDTH = 8  # the memory provider's exact hints stop here (bounded_hints.EXACT_NODE_LIMIT)


class MachineCapacity:
    """The machine's NUMA node ids (ascending) and each resource's allocatable memory per node:
    what no allocation changes, so every state derived from one machine state shares one.

    Masks here are over positions in ``node_ids`` (bit i = ``node_ids[i]``).
    """

    def __init__(self, nodes: Mapping[int, NodeState]) -> None:
        self.node_ids = tuple(nodes)
        self.ids_are_positions = self.node_ids == tuple(range(len(self.node_ids)))
        self._allocatable = {
            resource: tuple(node.tables[resource].allocatable if resource in node.tables else 0
                            for node in nodes.values())
            for resource in {r for node in nodes.values() for r in node.tables}}
        # One answer per distinct request (bounded: requests come in many sizes over time), on
        # machines small enough that the provider lists every mask on every admission.
        self._kept_masks_that_could_fit = lru_cache(maxsize=128)(self._masks_that_could_fit)

    def masks_that_could_fit(self, request: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
        """The masks, in ``iterate_masks`` order, whose allocatable memory holds every
        (resource, bytes) of ``request``: those that could fit on an empty machine."""
        if len(self.node_ids) > _KEPT_WIDTH:
            return self._masks_that_could_fit(request)
        return self._kept_masks_that_could_fit(request)

    def _masks_that_could_fit(self, request: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
        width = len(self.node_ids)
        masks: Sequence[int] = kubelet_order(width)
        for resource, needed in request:
            per_node = self._allocatable.get(resource, (0,) * width)
            sums = subset_sums(per_node)
            masks = [m for m in masks if sums[m] >= needed]
        return tuple(masks)


# --- spilling a block over its nodes: shared by allocate, remove and validate -------------------

def reserve_on(nodes: MutableMapping[int, NodeState], mask: Mask, resource: str,
               amount: int) -> None:
    """Count one assignment on every node of ``mask`` (grouping them), then take ``amount``
    of ``resource`` from their free memory in ascending node order."""
    for node_id in mask:
        node = nodes[node_id]
        tables = node.tables.copy()
        if amount > 0 and tables[resource].free > 0:
            taken = min(amount, tables[resource].free)
            tables[resource] = tables[resource].take(taken)
            amount -= taken
        nodes[node_id] = _node(tables, mask, node.assignments + 1)


def release_on(nodes: MutableMapping[int, NodeState], mask: Mask, resource: str,
               amount: int) -> None:
    """Undo one assignment on every node of ``mask`` (a node left with none leaves its group),
    and give ``amount`` back from their reserved memory in ascending node order."""
    for node_id in mask:
        node = nodes[node_id]
        tables = node.tables.copy()
        if amount > 0 and tables[resource].reserved > 0:
            given = min(amount, tables[resource].reserved)
            tables[resource] = tables[resource].give_back(given)
            amount -= given
        assignments = node.assignments - 1
        cells = (node_id,) if assignments == 0 else node.cells
        nodes[node_id] = _node(tables, cells, assignments)


def _node(tables: dict[str, MemoryTable], cells: Mask, assignments: int) -> NodeState:
    """``NodeState(tables, cells, assignments)`` for a fresh ``tables`` dict and sorted
    ``cells``, as ``__post_init__`` would leave them, without copying them again."""
    node = object.__new__(NodeState)
    node.__dict__.update(tables=MappingProxyType(tables), cells=cells, assignments=assignments)
    return node


def machine_state_difference(actual: Mapping[int, NodeState],
                             expected: Mapping[int, NodeState]) -> str | None:
    """The first way ``actual`` differs from ``expected`` in the kubelet's comparison, or None.

    Free and reserved memory are compared as sums over each node's group: spilling makes the
    split between a group's nodes depend on the order containers came and went.
    """
    if set(actual) != set(expected):
        return f"NUMA nodes {sorted(actual)}, expected {sorted(expected)}"
    for node_id, a in actual.items():
        e = expected[node_id]
        if a.assignments != e.assignments:
            return f"node {node_id} has {a.assignments} assignments, expected {e.assignments}"
        if set(a.cells) != set(e.cells):
            return f"node {node_id} is grouped with {list(a.cells)}, expected {list(e.cells)}"
        if set(a.tables) != set(e.tables):
            return f"node {node_id} has {sorted(a.tables)}, expected {sorted(e.tables)}"
        for name, table in a.tables.items():
            other = e.tables[name]
            for attr in ("total", "system_reserved", "allocatable"):
                if getattr(table, attr) != getattr(other, attr):
                    return (f"node {node_id} {name} {attr} is {getattr(table, attr)}, "
                            f"expected {getattr(other, attr)}")
            for attr in ("free", "reserved"):
                mine = _group_sum(actual, a.cells, name, attr)
                theirs = _group_sum(expected, a.cells, name, attr)
                if mine != theirs:
                    return (f"nodes {list(a.cells)} {name} {attr} is {mine}, expected {theirs}")
    return None


def _group_sum(nodes: Mapping[int, NodeState], group: Mask, resource: str, attr: str) -> int:
    return sum(getattr(nodes[n].tables[resource], attr) for n in group
               if n in nodes and resource in nodes[n].tables)
