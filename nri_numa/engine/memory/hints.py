"""Memory Manager topology hints (§5.3 of docs/kubelet-algorithms.md).

* ``memory_hints(state, pod_id, request)`` — every NUMA mask (in ``iterate_masks`` order: by size,
  then lexicographic) that could hold ``request`` (resource → bytes) now, the same masks for every
  requested resource. A mask is a hint when its nodes' allocatable memory could ever hold the
  request, it respects the groups already formed (a node used alone never joins a multi-node mask;
  a grouped node is only used with exactly its group), and its free memory plus what this pod's
  finished init containers left on that mask holds the request. Hints of the fewest nodes that
  could hold the request on an empty machine are preferred. No hint at all gives ``{}``: the
  topology manager reads that as "no preference", and ``allocate`` then reports the failure.
* ``container_hints`` / ``pod_hints`` — the same, except that a container (for the pod: the first
  container, init containers first) that already has blocks regenerates its hints from them:
  one preferred hint per block, or ``None`` (no preference) when the blocks no longer match the
  request. Requests may hold other resources (``cpu``): only memory and hugepages count.
* ``best_hint`` — the kubelet's pick among hints: preferred first, then the narrowest mask, the
  earliest on ties.

Hint generation looks at every mask, 2**n - 1 of them for n NUMA nodes. Which masks could hold a
request on an empty machine depends on the machine alone and is kept with the state's
``capacity``; free memory per mask comes from a table of sums over every mask, and the group rules
are checked one by one only on the few groups already formed. That stays small up to the
kubelet's limit of 8 nodes and grows with the 2**n masks past it (bench/README.md); from 16
nodes on, the list itself is the problem (on an empty 32-node machine every mask
fits a small request). The way out is structural: apart from single nodes and the groups
already formed (a handful of masks), every hint is a set of unused nodes whose free memory covers
the request, and adding an unused node never uncovers it, so those hints are exactly the supersets
(within the unused nodes) of the minimal covering sets. A provider for large machines would hand
the merge those minimal sets, the unused nodes and the groups instead of a list; the preferred
hints are the covering sets of the smallest size k that any k nodes' allocatable could hold
(found from per-resource prefix sums of the nodes sorted by allocatable, then a bounded search),
C(n, k) of them at most, and larger, non-preferred masks are only needed when no preferred merge
exists, so they can be produced lazily, size by size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nri_numa.engine.bitmask import bits, is_narrower, mask_of, subset_sums
from nri_numa.engine.hints import Hint, hints_of_masks
from nri_numa.engine.memory.nodes import Mask, NodeState
from nri_numa.engine.memory.resources import MEMORY, requested_resources
from nri_numa.engine.memory.state import Block, MemoryState

HintMap = dict[str, list[Hint]]


def memory_hints(state: MemoryState, pod_id: str, request: Mapping[str, int]) -> HintMap:
    """Hints for placing ``request`` for a container (or whole pod) of ``pod_id``."""
    request = requested_resources(request)
    resources = sorted(request)
    capacity = state.capacity
    node_ids = capacity.node_ids
    # Masks here are over positions in node_ids. Which could hold the request on an empty
    # machine depends on the machine alone, and is kept with its capacity.
    could_fit = capacity.masks_that_could_fit(tuple((r, request[r]) for r in resources))
    if not could_fit:
        return {}
    min_affinity = could_fit[0].bit_count()  # the order is by size first
    nodes = list(state.nodes.values())  # in node_ids order: the capacity was made from them
    free = {r: subset_sums([node.tables[r].free if r in node.tables else 0 for node in nodes])
            for r in resources}
    fits_now: Sequence[int] = could_fit
    for r in resources:
        sums, needed = free[r], request[r]
        fits_now = [m for m in fits_now if sums[m] >= needed]
    reusable = _reusable_by_position(state, pod_id, node_ids)
    if reusable:
        now = set(fits_now)
        fits_now = [m for m in could_fit if m in now or (m in reusable and all(
            free[r][m] + reusable[m].get(r, 0) >= request[r] for r in resources))]
    masks = _GroupRules(nodes, node_ids).filter(fits_now)
    if not masks:
        return {}
    if not capacity.ids_are_positions:
        masks = [mask_of(node_ids[p] for p in bits(m)) for m in masks]
    hints = hints_of_masks(masks, min_affinity)
    return {r: list(hints) for r in resources}


def _reusable_by_position(state: MemoryState, pod_id: str,
                          node_ids: Sequence[int]) -> dict[int, Mapping[str, int]]:
    """What this pod's finished init containers left, per mask over positions."""
    return {_positions_mask(node_ids, mask): sizes
            for mask, sizes in state.reusable.get(pod_id, {}).items()
            if set(mask) <= set(state.nodes)}


def container_hints(state: MemoryState, pod_id: str, container_name: str,
                    request: Mapping[str, int]) -> HintMap | None:
    blocks = state.container_blocks(pod_id, container_name)
    if blocks is not None:
        return regenerate_hints(blocks, request)
    return memory_hints(state, pod_id, request)


def pod_hints(state: MemoryState, pod_id: str, container_names: Sequence[str],
              request: Mapping[str, int]) -> HintMap | None:
    """``container_names``: the pod's init containers then its app containers, in spec order;
    ``request``: the pod's request (``request.pod_memory_requests``)."""
    for name in container_names:
        blocks = state.container_blocks(pod_id, name)
        if blocks is not None:
            return regenerate_hints(blocks, request)
    return memory_hints(state, pod_id, request)


def regenerate_hints(blocks: Sequence[Block], request: Mapping[str, int]) -> HintMap | None:
    """The hints an earlier allocation stands for; None when it no longer matches ``request``."""
    request = requested_resources(request)
    if len(blocks) != len(request):
        return None
    hints: HintMap = {r: [] for r in request}
    for block in blocks:
        if request.get(block.type) != block.size:
            return None
        hints[block.type].append(Hint(frozenset(block.numa_affinity), True))
    return hints


def best_hint(hints: Sequence[Hint]) -> Hint | None:
    best: Hint | None = None
    for hint in hints:
        if best is None or (hint.preferred and not best.preferred):
            best = hint
        elif hint.preferred == best.preferred and is_narrower(_mask(hint), _mask(best)):
            best = hint
    return best


def _mask(hint: Hint) -> int:
    # memory hints always name nodes; a hint without affinity (None) ranks as the empty mask
    return hint.mask or 0


def lead_resource(request: Mapping[str, int]) -> str:
    """The resource whose hints stand for all: every resource gets the same masks, and the
    kubelet reads regular memory's (which every Guaranteed container requests)."""
    return MEMORY if MEMORY in request else min(request)


def _positions_mask(node_ids: Sequence[int], nodes: Mask) -> int:
    return sum(1 << node_ids.index(n) for n in nodes)


class _GroupRules:
    """Which masks (over positions) respect the groups already formed: a node used alone never
    joins a multi-node mask, a grouped node is only used with exactly its group."""

    def __init__(self, nodes: Sequence[NodeState], node_ids: Sequence[int]) -> None:
        """``nodes``: the states of ``node_ids``, in that order."""
        self.grouped = self.used_alone = 0
        self.used_group: dict[int, int] = {}  # position of a used grouped node → its group
        for p, node in enumerate(nodes):
            if len(node.cells) > 1:
                self.grouped |= 1 << p
                if node.assignments > 0:
                    self.used_group[p] = _positions_mask(node_ids, node.cells)
            elif node.assignments > 0:
                self.used_alone |= 1 << p
        self.used = sum(1 << p for p in self.used_group) | self.used_alone

    def allow(self, mask: int) -> bool:
        if mask & (mask - 1) == 0:
            return not mask & self.grouped
        if not mask & self.used:
            return True
        if mask & self.used_alone:
            return False
        return all(self.used_group[p] == mask for p in bits(mask & self.used))

    def filter(self, masks: Sequence[int]) -> list[int]:
        """The masks ``allow`` lets through, in their order, without asking it mask by mask: a
        multi-node mask touching a used node passes only if it is that node's group, so those
        that pass are the masks of no used node and the few groups ``allow`` accepts."""
        grouped, used = self.grouped, self.used
        groups = {g for g in self.used_group.values() if self.allow(g)}
        return [m for m in masks
                if (not m & used or m in groups if m & (m - 1) else not m & grouped)]
