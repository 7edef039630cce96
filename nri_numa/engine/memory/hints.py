"""Memory Manager topology hints (§5.3 of docs/kubelet-semantics.md).

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

Hint generation looks at every mask, 2**n - 1 of them for n NUMA nodes, building each mask's
sums from a smaller mask's: a few milliseconds for the kubelet's limit of 8 nodes, about a second
and a half for 16. Past that the list itself is the problem (on an empty 32-node machine every
mask fits a small request). The way out is structural: apart from single nodes and the groups
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

from nri_numa.engine.bitmask import bits, is_narrower, iterate_masks
from nri_numa.engine.hints import Hint
from nri_numa.engine.memory.resources import MEMORY, requested_resources
from nri_numa.engine.memory.state import Block, Mask, MemoryState, NodeState

HintMap = dict[str, list[Hint]]


def memory_hints(state: MemoryState, pod_id: str, request: Mapping[str, int]) -> HintMap:
    """Hints for placing ``request`` for a container (or whole pod) of ``pod_id``."""
    request = requested_resources(request)
    node_ids = list(state.nodes)  # ascending
    resources = sorted(request)
    # Masks here are over positions in node_ids, so that a mask's sums are those of the mask
    # without its lowest node, which iterate_masks has always produced before, plus that node's.
    per_node = [[_amounts(state.nodes[n], r) for n in node_ids] for r in resources]
    sums = [[(0, 0)] * (1 << len(node_ids)) for _ in resources]
    needed = [request[r] for r in resources]
    groups = _GroupRules(state, node_ids)
    reusable = {_positions_mask(node_ids, mask): sizes
                for mask, sizes in state.reusable.get(pod_id, {}).items()
                if set(mask) <= set(state.nodes)}
    min_affinity = len(node_ids)
    masks: list[int] = []
    for mask in iterate_masks(range(len(node_ids))):
        rest, low = mask & (mask - 1), (mask & -mask).bit_length() - 1
        fits_ever = fits_now = True
        for i, need in enumerate(needed):
            allocatable, free = sums[i][rest]
            node_allocatable, node_free = per_node[i][low]
            sums[i][mask] = (allocatable + node_allocatable, free + node_free)
            fits_ever = fits_ever and allocatable + node_allocatable >= need
            fits_now = fits_now and free + node_free >= need
        if not fits_ever:
            continue
        # measured before the group and free-memory filters: what an empty machine could do
        min_affinity = min(min_affinity, mask.bit_count())
        if not groups.allow(mask):
            continue
        if fits_now or (mask in reusable and all(
                sums[i][mask][1] + reusable[mask].get(r, 0) >= need
                for i, (r, need) in enumerate(zip(resources, needed, strict=False)))):
            masks.append(mask)
    if not masks:
        return {}
    hints = [Hint([node_ids[p] for p in bits(m)], m.bit_count() == min_affinity) for m in masks]
    return {r: list(hints) for r in resources}


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


def _amounts(node: NodeState, resource: str) -> tuple[int, int]:
    """(allocatable, free); a node without the resource (a hugepage size it lacks) has none."""
    table = node.tables.get(resource)
    return (table.allocatable, table.free) if table else (0, 0)


def _positions_mask(node_ids: Sequence[int], nodes: Mask) -> int:
    return sum(1 << node_ids.index(n) for n in nodes)


class _GroupRules:
    """Which masks (over positions) respect the groups already formed: a node used alone never
    joins a multi-node mask, a grouped node is only used with exactly its group."""

    def __init__(self, state: MemoryState, node_ids: Sequence[int]) -> None:
        nodes = [state.nodes[n] for n in node_ids]
        self.grouped = sum(1 << p for p, node in enumerate(nodes) if len(node.cells) > 1)
        self.used_alone = sum(1 << p for p, node in enumerate(nodes)
                              if node.assignments > 0 and len(node.cells) == 1)
        self.used_group = {p: _positions_mask(node_ids, node.cells) for p, node in enumerate(nodes)
                           if node.assignments > 0 and len(node.cells) > 1}
        self.used = sum(1 << p for p in self.used_group) | self.used_alone

    def allow(self, mask: int) -> bool:
        if mask & (mask - 1) == 0:
            return not mask & self.grouped
        if not mask & self.used:
            return True
        if mask & self.used_alone:
            return False
        return all(self.used_group[p] == mask for p in bits(mask & self.used))
