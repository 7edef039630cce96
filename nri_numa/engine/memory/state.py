"""The Memory Manager's state as one immutable value (§5.2 of docs/kubelet-algorithms.md).

``MemoryState`` holds, per NUMA node, a ``MemoryTable`` per resource (total, system reserved,
allocatable, reserved, free), the node's ``cells`` (the group of nodes it is allocated with; just
itself when used alone or unused) and its number of assignments (one per (block, node) pair);
per (pod, container) the ``Block``s it was given; and per pod the memory its regular init
containers left behind for later containers to reuse (per NUMA mask, per resource).

Operations never change a state: ``allocate``/``remove`` (allocate.py) return a new one. The
per-node values (``MemoryTable``, ``NodeState``) and the arithmetic over a map of nodes (spilling
a block over its group, comparing two machine states, the machine's capacity) are in nodes.py.

* ``MemoryState.from_topology(topology, reserved)`` — the default machine state: hugepages are
  carved out of regular memory's allocatable, ``reserved`` (``reservedMemory``: node → resource →
  bytes) is taken off each table. ``check_reserved_memory`` is the check the kubelet's static
  policy makes when it starts (``you should specify the system reserved memory``).
* ``validate(default)`` replays every block on ``default`` and compares the result with this
  state the way the kubelet does (free/reserved compared as sums over each node's group), raising
  ``MemoryStateError`` with the kubelet's message; ``restore`` also accepts an empty state.
* ``to_dict``/``from_dict`` — the JSON form, with the kubelet checkpoint's field names
  (``machineState``, ``memoryMap``, ``cells``, ``numberOfAssignments``, ``entries``,
  ``numaAffinity``)
  plus ``reusable``; ``from_dict`` names the first bad field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from nri_numa.engine.memory.nodes import (MachineCapacity, Mask, MemoryTable, NodeState,
                                          machine_state_difference, reserve_on)
from nri_numa.engine.memory.resources import MEMORY, hugepage_resource_name, is_memory_resource
from nri_numa.engine.quantity import format_binary
from nri_numa.topology.model import Topology

ReservedMemory = Mapping[int, Mapping[str, int]]  # node → resource → bytes

_TABLE_FIELDS = ("total", "systemReserved", "allocatable", "reserved", "free")


class MemoryStateError(ValueError):
    """A state that does not describe this machine or its assignments; the message says why."""


class ReservedMemoryError(ValueError):
    """A ``reservedMemory`` setting the static policy cannot start with."""


@dataclass(frozen=True, slots=True)
class Block:
    numa_affinity: Mask
    type: str  # resource name
    size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "numa_affinity", tuple(sorted(self.numa_affinity)))


# Not slots: cached_property and derive use the instance's __dict__.
@dataclass(frozen=True)
class MemoryState:
    nodes: Mapping[int, NodeState]
    blocks: Mapping[str, Mapping[str, tuple[Block, ...]]] = field(default_factory=dict)
    # pod → mask → resource → bytes left by regular init containers, reusable by later ones
    reusable: Mapping[str, Mapping[Mask, Mapping[str, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(sorted(self.nodes.items()))))
        object.__setattr__(self, "blocks", MappingProxyType({
            pod: MappingProxyType({name: tuple(bs) for name, bs in containers.items()})
            for pod, containers in self.blocks.items() if containers}))
        object.__setattr__(self, "reusable", _normalised_reusable(self.reusable))

    @cached_property
    def capacity(self) -> MachineCapacity:
        """What no allocation changes; ``derive`` hands it on to the states made from this one."""
        return MachineCapacity(self.nodes)

    def derive(self, nodes: Mapping[int, NodeState], pod_id: str,
               pod_blocks: Mapping[str, tuple[Block, ...]],
               reusable: Mapping[str, Mapping[Mask, Mapping[str, int]]]) -> MemoryState:
        """This state after an allocation or a removal: ``nodes`` with the same ids in the same
        order and the same allocatable memory (only reserved and free memory, cells and
        assignments change), ``pod_id``'s blocks replaced by ``pod_blocks``, and ``reusable``.

        The same value the constructor would build, but only the parts that changed are
        normalised (the constructor re-wraps every pod's blocks), and the capacity is shared.
        """
        blocks = self.blocks.copy()  # the view's dict, copied at C speed
        if pod_blocks:
            blocks[pod_id] = MappingProxyType({name: tuple(bs) for name, bs in pod_blocks.items()})
        else:
            blocks.pop(pod_id, None)
        derived = object.__new__(MemoryState)
        derived.__dict__.update(nodes=MappingProxyType(dict(nodes)),
                                blocks=MappingProxyType(blocks),
                                reusable=_normalised_reusable(reusable))
        if "capacity" in self.__dict__:
            derived.__dict__["capacity"] = self.capacity
        return derived

    @classmethod
    def from_topology(cls, topology: Topology, reserved_memory: ReservedMemory) -> MemoryState:
        return cls(nodes={n.id: _default_node(n.id, n.memory_bytes, n.hugepages,
                                              reserved_memory.get(n.id, {}))
                          for n in topology.numa_nodes})

    def container_blocks(self, pod_id: str, container_name: str) -> tuple[Block, ...] | None:
        """The container's blocks, or None when it has none (the kubelet's nil)."""
        return self.blocks.get(pod_id, {}).get(container_name)

    def reusable_memory(self, pod_id: str, mask: Mask, resource: str) -> int:
        return self.reusable.get(pod_id, {}).get(mask, {}).get(resource, 0)

    # --- validation ---------------------------------------------------------------------------

    def validate(self, default: MemoryState) -> None:
        """Raise ``MemoryStateError`` unless replaying the blocks on ``default`` gives this."""
        if not self.nodes:
            if self.blocks:
                raise MemoryStateError("[memorymanager] machine state can not be empty when it "
                                       "has memory assignments")
            return
        nodes = dict(default.nodes)
        for pod, containers in sorted(self.blocks.items()):
            for name, blocks in containers.items():
                for block in blocks:
                    _replay(nodes, pod, name, block)
        difference = machine_state_difference(self.nodes, nodes)
        if difference is not None:
            raise MemoryStateError("[memorymanager] the expected machine state is different from "
                                   f"the real one ({difference})")

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "machineState": {str(n): _node_to_dict(s) for n, s in self.nodes.items()},
            "entries": {pod: {name: [_block_to_dict(b) for b in blocks]
                              for name, blocks in containers.items()}
                        for pod, containers in sorted(self.blocks.items())},
            "reusable": {pod: [{"numaAffinity": list(mask), "type": res, "size": size}
                               for mask, sizes in sorted(masks.items())
                               for res, size in sorted(sizes.items())]
                         for pod, masks in sorted(self.reusable.items())},
        }

    @classmethod
    def from_dict(cls, data: Any) -> MemoryState:
        return _StateReader().read(data)


def _normalised_reusable(reusable: Mapping[str, Mapping[Mask, Mapping[str, int]]]
                         ) -> Mapping[str, Mapping[Mask, Mapping[str, int]]]:
    return MappingProxyType({
        pod: MappingProxyType({tuple(sorted(mask)): MappingProxyType(dict(sizes))
                               for mask, sizes in masks.items()})
        for pod, masks in reusable.items()})


def restore(stored: MemoryState, default: MemoryState) -> MemoryState:
    """The kubelet's Start: an empty state becomes ``default``; any other must validate."""
    stored.validate(default)
    return stored if stored.nodes else default


def check_reserved_memory(topology: Topology, reserved_memory: ReservedMemory) -> None:
    """The static policy's start-up checks on ``reservedMemory``."""
    node_ids = {n.id for n in topology.numa_nodes}
    for node, resources in sorted(reserved_memory.items()):
        if node not in node_ids:
            raise ReservedMemoryError(f"the reserved memory configuration references a NUMA node "
                                      f"{node} that does not exist on this machine")
        for name, size in sorted(resources.items()):
            if not is_memory_resource(name):
                raise ReservedMemoryError(f"reservedMemory for NUMA node {node} names {name!r}, "
                                          "which is neither memory nor hugepages-<size>")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ReservedMemoryError(f"reservedMemory for NUMA node {node}, {name}: "
                                          f"{size!r} is not a number of bytes")
    if sum(r.get(MEMORY, 0) for r in reserved_memory.values()) <= 0:
        raise ReservedMemoryError("[memorymanager] you should specify the system reserved memory")
    for node in topology.numa_nodes:
        _default_node(node.id, node.memory_bytes, node.hugepages, reserved_memory.get(node.id, {}))


def _default_node(node_id: int, memory_bytes: int, hugepages: Mapping[int, Any],
                  reserved: Mapping[str, int]) -> NodeState:
    tables: dict[str, MemoryTable] = {}
    hugepage_bytes = 0
    for size_kib, pages in sorted(hugepages.items()):
        name = hugepage_resource_name(size_kib)
        total = pages.total * size_kib * 1024
        tables[name] = _default_table(node_id, name, total, reserved.get(name, 0), total)
        hugepage_bytes += total
    for name in reserved:
        if name != MEMORY and name not in tables:
            raise ReservedMemoryError(f"reservedMemory for NUMA node {node_id} names {name}, "
                                      "which that node does not have")
    tables[MEMORY] = _default_table(node_id, MEMORY, memory_bytes, reserved.get(MEMORY, 0),
                                    memory_bytes - hugepage_bytes)
    return NodeState(tables=tables, cells=(node_id,))


def _default_table(node: int, name: str, total: int, reserved: int, usable: int) -> MemoryTable:
    if usable < 0:
        hugepages = format_binary(total - usable)
        raise ReservedMemoryError(f"NUMA node {node}: its hugepages ({hugepages}) are more than "
                                  f"its memory ({format_binary(total)})")
    allocatable = usable - reserved
    if allocatable < 0:
        raise ReservedMemoryError(
            f"NUMA node {node}: {name} reserved {format_binary(reserved)} is more than the "
            f"{format_binary(usable)} it has" + (" after hugepages" if usable != total else ""))
    return MemoryTable(total=total, system_reserved=reserved, allocatable=allocatable,
                       reserved=0, free=allocatable)


def _replay(nodes: dict[int, NodeState], pod: str, container: str, block: Block) -> None:
    where = f"(pod: {pod}, container: {container})"
    for node_id in block.numa_affinity:
        if node_id not in nodes:
            raise MemoryStateError(f"[memorymanager] {where} the memory assignment uses the NUMA "
                                   "that does not exist")
        if block.type not in nodes[node_id].tables:
            raise MemoryStateError(f"[memorymanager] {where} the memory assignment uses memory "
                                   "resource that does not exist")
    reserve_on(nodes, block.numa_affinity, block.type, block.size)


def _node_to_dict(node: NodeState) -> dict[str, Any]:
    return {
        "numberOfAssignments": node.assignments,
        "memoryMap": {name: dict(zip(_TABLE_FIELDS, (t.total, t.system_reserved, t.allocatable,
                                                     t.reserved, t.free), strict=False))
                      for name, t in sorted(node.tables.items())},
        "cells": list(node.cells),
    }


def _block_to_dict(block: Block) -> dict[str, Any]:
    return {"numaAffinity": list(block.numa_affinity), "type": block.type, "size": block.size}


class _StateReader:
    """Reads the JSON form strictly; every error names the path of the bad field."""

    def read(self, data: Any) -> MemoryState:
        d = self._obj(data, "state")
        machine = self._obj(d.get("machineState", {}), "machineState")
        nodes = {self._node_id(k, "machineState"): v for k, v in machine.items()}
        return MemoryState(
            nodes={n: self._node(raw, f"machineState.{n}", n, set(nodes))
                   for n, raw in nodes.items()},
            blocks={pod: {name: self._blocks(raw, f"entries.{pod}.{name}")
                          for name, raw in self._obj(containers, f"entries.{pod}").items()}
                    for pod, containers in self._obj(d.get("entries", {}), "entries").items()},
            reusable={pod: self._reusable(raw, f"reusable.{pod}")
                      for pod, raw in self._obj(d.get("reusable", {}), "reusable").items()},
        )

    def _node(self, raw: Any, where: str, node_id: int, node_ids: set[int]) -> NodeState:
        n = self._obj(raw, where)
        tables = {}
        for name, t in self._obj(n.get("memoryMap"), f"{where}.memoryMap").items():
            self._resource(name, f"{where}.memoryMap")
            tables[name] = self._table(t, f"{where}.memoryMap.{name}")
        cells = self._mask(n.get("cells"), f"{where}.cells")
        if node_id not in cells:
            raise MemoryStateError(f"{where}.cells {list(cells)} does not contain node {node_id}")
        if not set(cells) <= node_ids:
            raise MemoryStateError(f"{where}.cells {list(cells)} names NUMA nodes "
                                   f"{sorted(set(cells) - node_ids)} that are not in machineState")
        return NodeState(tables=tables, cells=cells,
                         assignments=self._size(n.get("numberOfAssignments"),
                                                f"{where}.numberOfAssignments"))

    def _table(self, raw: Any, where: str) -> MemoryTable:
        t = self._obj(raw, where)
        table = MemoryTable(*(self._size(t.get(f), f"{where}.{f}") for f in _TABLE_FIELDS))
        if table.free + table.reserved != table.allocatable:
            raise MemoryStateError(f"{where}: free {table.free} + reserved {table.reserved} is not "
                                   f"allocatable {table.allocatable}")
        return table

    def _block(self, raw: Any, where: str) -> Block:
        b = self._obj(raw, where)
        return Block(numa_affinity=self._mask(b.get("numaAffinity"), f"{where}.numaAffinity"),
                     type=self._resource(b.get("type"), f"{where}.type"),
                     size=self._size(b.get("size"), f"{where}.size"))

    def _blocks(self, raw: Any, where: str) -> tuple[Block, ...]:
        return tuple(self._block(b, f"{where}[{i}]") for i, b in enumerate(self._arr(raw, where)))

    def _reusable(self, raw: Any, where: str) -> dict[Mask, dict[str, int]]:
        out: dict[Mask, dict[str, int]] = {}
        for i, entry in enumerate(self._arr(raw, where)):
            block = self._block(entry, f"{where}[{i}]")
            out.setdefault(block.numa_affinity, {})[block.type] = block.size
        return out

    # --- primitives ---------------------------------------------------------------------------

    @staticmethod
    def _obj(v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise MemoryStateError(f"{where} must be an object, not {type(v).__name__}")
        return v

    @staticmethod
    def _arr(v: Any, where: str) -> list:
        if not isinstance(v, list):
            raise MemoryStateError(f"{where} must be a list, not {type(v).__name__}")
        return v

    @staticmethod
    def _size(v: Any, where: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise MemoryStateError(f"{where} must be a non-negative integer, not {v!r}")
        return v

    def _node_id(self, v: Any, where: str) -> int:
        if isinstance(v, str) and v.isdigit():
            return int(v)
        raise MemoryStateError(f"{where} key {v!r} is not a NUMA node id")

    def _mask(self, v: Any, where: str) -> Mask:
        ids = [self._size(i, f"{where}[{k}]") for k, i in enumerate(self._arr(v, where))]
        if not ids or len(set(ids)) != len(ids):
            raise MemoryStateError(f"{where} must list distinct NUMA node ids, not {v!r}")
        return tuple(sorted(ids))

    @staticmethod
    def _resource(v: Any, where: str) -> str:
        if not isinstance(v, str) or not is_memory_resource(v):
            raise MemoryStateError(f"{where}: {v!r} is neither memory nor hugepages-<size>")
        return v
