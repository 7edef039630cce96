"""Allocating and releasing a container's memory (§5.4–5.6 of docs/kubelet-algorithms.md).

``allocate(state, pod_id, container_name, request, hint, init_containers=...)`` places
``request`` (resource → bytes; non-memory resources are ignored) for a container of a Guaranteed
pod (the caller decides QoS) and returns the new state:

1. a container that already has blocks only refreshes the pod's init-container reuse record;
2. ``hint`` is the topology manager's answer; without a mask the best of ``memory_hints`` is used
   (it must be preferred if ``hint`` was);
3. a mask whose free memory cannot hold the request is extended to the best hint containing it
   (again preferred if the current one was). Unlike the kubelet, a single node that belongs to a
   group is extended too (to its group) rather than taken alone: see ``_lone_member_of_group``;
4. a multi-node mask must not take a node used alone or grouped differently;
5. every requested resource gets one block on the mask; what this pod's finished regular init
   containers left on that mask is reused first, the rest is taken from the mask's nodes in
   ascending order, and the mask becomes the group of all its nodes;
6. the reuse record is updated (a regular init container leaves its blocks behind, anything else
   consumes them), and earlier regular init containers' blocks shrink by what this container
   reused, so that the blocks of a pod add up to what it holds.

``init_containers`` lists the pod's init containers in spec order; whether the container itself is
a regular init container, a sidecar or an app container follows from it. Errors are
``MemoryAllocationError`` with the kubelet's text.

``adopt(state, pod_id, container_name, blocks, request)`` takes blocks another manager gave a
running container (the kubelet's ``memory_manager_state``) as they are, when they hold exactly
``request``, fit the free memory and keep the groups whole; else ``MemoryAllocationError``.

``remove(state, pod_id, container_name)`` gives a container's blocks back (a node left with no
assignment leaves its group). Removing an unknown container returns the state unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from nri_numa.engine.hints import Hint
from nri_numa.engine.memory.hints import best_hint, lead_resource, memory_hints
from nri_numa.engine.memory.nodes import Mask, release_on, reserve_on
from nri_numa.engine.memory.resources import InitContainer, requested_resources
from nri_numa.engine.memory.state import Block, MemoryState, MemoryStateError
from nri_numa.engine.quantity import format_binary


class MemoryAllocationError(Exception):
    """The container's memory cannot be placed; the message is the kubelet's."""


HintSource = Callable[[MemoryState, str, Mapping[str, int]], Mapping[str, list[Hint]]]


def allocate(state: MemoryState, pod_id: str, container_name: str, request: Mapping[str, int],
             hint: Hint, *, init_containers: Sequence[InitContainer] = (),
             hints_for: HintSource = memory_hints) -> MemoryState:
    """``hints_for`` gives the hints a default or extended placement is chosen from: the
    kubelet's exact ``memory_hints`` unless the caller bounds them (machines past 8 nodes)."""
    existing = state.container_blocks(pod_id, container_name)
    if existing is not None:
        return state.derive(state.nodes, pod_id, state.blocks[pod_id], _reuse_record(
            state, pod_id, container_name, init_containers, existing))
    request = requested_resources(request)
    if not request:
        return state
    mask = _placement(state, pod_id, request, hint, hints_for)
    nodes = state.nodes.copy()
    blocks = tuple(Block(mask, r, request[r]) for r in sorted(request))
    for block in blocks:
        reusable = state.reusable_memory(pod_id, mask, block.type)
        reserve_on(nodes, mask, block.type, max(0, block.size - reusable))
    pod_blocks = state.blocks.get(pod_id, {}).copy()
    pod_blocks[container_name] = blocks
    _shrink_init_blocks(pod_blocks, container_name, init_containers, blocks)
    return state.derive(nodes, pod_id, pod_blocks,
                        _reuse_record(state, pod_id, container_name, init_containers, blocks))


def adopt(state: MemoryState, pod_id: str, container_name: str, blocks: Sequence[Block],
          request: Mapping[str, int]) -> MemoryState:
    """``state`` with the container holding ``blocks``: one mask for all of them, as ``allocate``
    would have made (the kubelet's static policy gives every resource of a container the same
    mask), each resource as large as the request."""
    if state.container_blocks(pod_id, container_name) is not None:
        raise MemoryAllocationError("the container holds memory already")
    request = requested_resources(request)
    masks = {b.numa_affinity for b in blocks}
    sizes = {b.type: b.size for b in blocks}
    if len(masks) != 1 or len(sizes) != len(blocks) or sizes != dict(request):
        raise MemoryAllocationError(f"the blocks ({_described(blocks)}) are not one mask holding "
                                    f"what the container asks for ({_described_request(request)})")
    mask = masks.pop()
    unknown = [n for n in mask if n not in state.nodes
               or not set(request) <= set(state.nodes[n].tables)]
    if not mask or unknown:
        raise MemoryAllocationError(f"NUMA nodes {list(unknown or mask)} are not this machine's "
                                    "or lack a resource asked for")
    if not _fits(state, mask, request):
        raise MemoryAllocationError(f"NUMA nodes {list(mask)} have not that much free")
    if _breaks_groups(state, mask) or _lone_member_of_group(state, mask):
        raise MemoryAllocationError(f"NUMA nodes {list(mask)} are used by other containers "
                                    "alone or in another group")
    nodes = state.nodes.copy()
    for block in blocks:
        reserve_on(nodes, mask, block.type, block.size)
    pod_blocks = state.blocks.get(pod_id, {}).copy()
    pod_blocks[container_name] = tuple(sorted(blocks, key=lambda b: b.type))
    return state.derive(nodes, pod_id, pod_blocks, state.reusable)


def _described(blocks: Sequence[Block]) -> str:
    return ", ".join(f"{b.type} {format_binary(b.size)} on {list(b.numa_affinity)}"
                     for b in blocks) or "none"


def _described_request(request: Mapping[str, int]) -> str:
    return ", ".join(f"{r} {format_binary(size)}" for r, size in sorted(request.items())) or "nothing"


def remove(state: MemoryState, pod_id: str, container_name: str) -> MemoryState:
    blocks = state.container_blocks(pod_id, container_name)
    if blocks is None:
        return state
    nodes = state.nodes.copy()
    for block in blocks:
        if not all(n in nodes and block.type in nodes[n].tables for n in block.numa_affinity):
            raise MemoryStateError(f"(pod: {pod_id}, container: {container_name}) holds "
                                   f"{block.type} on NUMA nodes {list(block.numa_affinity)}, "
                                   "which the machine state does not have")
        release_on(nodes, block.numa_affinity, block.type, block.size)
    pod_blocks = {name: bs for name, bs in state.blocks[pod_id].items() if name != container_name}
    return state.derive(nodes, pod_id, pod_blocks, state.reusable)


# --- choosing the mask ------------------------------------------------------------------------

def _placement(state: MemoryState, pod_id: str, request: Mapping[str, int], hint: Hint,
               hints_for: HintSource) -> Mask:
    best = hint
    if hint.affinity is None:
        default = best_hint(hints_for(state, pod_id, request).get(lead_resource(request), []))
        if default is None:
            raise MemoryAllocationError("[memorymanager] failed to get the default NUMA affinity, "
                                        "no NUMA nodes with enough memory is available")
        if not default.preferred and best.preferred:
            raise MemoryAllocationError("[memorymanager] failed to find the default preferred hint")
        best = default
    mask = tuple(sorted(best.affinity))
    unknown = [n for n in mask if n not in state.nodes]
    if unknown:
        raise MemoryAllocationError(f"[memorymanager] the hint names NUMA nodes {unknown} that "
                                    "the machine state does not have")
    if not _fits(state, mask, request) or _lone_member_of_group(state, mask):
        extended = _extension(state, pod_id, request, mask, hints_for)
        if not extended.preferred and best.preferred:
            raise MemoryAllocationError("[memorymanager] failed to find the extended preferred "
                                        "hint")
        mask = tuple(sorted(extended.affinity))
    if _breaks_groups(state, mask):
        raise MemoryAllocationError("[memorymanager] preferred hint violates NUMA node allocation")
    for n in mask:
        missing = sorted(set(request) - set(state.nodes[n].tables))
        if missing:
            # sysfs lists every hugepage size on every node, so only a hand-made state gets here
            raise MemoryAllocationError(
                f"[memorymanager] NUMA node {n} has no {', '.join(missing)}")
    return mask


def _fits(state: MemoryState, mask: Mask, request: Mapping[str, int]) -> bool:
    return all(sum(state.nodes[n].tables[r].free for n in mask if r in state.nodes[n].tables)
               >= size for r, size in request.items())


def _lone_member_of_group(state: MemoryState, mask: Mask) -> bool:
    """A single node that belongs to a group. The kubelet takes such a mask when it fits, which
    makes the node count as used alone while it still holds part of a cross-NUMA container, so
    its group can never be used again; memory hints never offer it, but a best-effort merge with
    other providers can. Extending it to its group instead keeps the groups whole."""
    return len(mask) == 1 and len(state.nodes[mask[0]].cells) > 1


def _extension(state: MemoryState, pod_id: str, request: Mapping[str, int], mask: Mask,
               hints_for: HintSource) -> Hint:
    """The best hint whose mask holds ``mask``: the topology manager may have narrowed ours."""
    hints = hints_for(state, pod_id, request).get(lead_resource(request), [])
    wider = best_hint([h for h in hints if set(mask) <= h.affinity])
    if wider is None:
        raise MemoryAllocationError("[memorymanager] failed to find NUMA nodes to extend the "
                                    "current topology hint")
    return wider


def _breaks_groups(state: MemoryState, mask: Mask) -> bool:
    if len(mask) == 1:
        return False
    return any(node.assignments > 0 and (len(node.cells) == 1 or node.cells != mask)
               for node in (state.nodes[n] for n in mask))


# --- init-container reuse ---------------------------------------------------------------------

def _is_regular_init(container_name: str, init_containers: Sequence[InitContainer]) -> bool:
    return any(c.name == container_name and not c.restartable for c in init_containers)


def _reuse_record(state: MemoryState, pod_id: str, container_name: str,
                  init_containers: Sequence[InitContainer], blocks: Sequence[Block]
                  ) -> dict[str, dict[Mask, dict[str, int]]]:
    """The reuse record after this container. Unlike the kubelet, other pods' entries are kept:
    through NRI the containers of different pods are admitted interleaved, and each pod's entry
    goes when the pod is released (providers/memory.py)."""
    record = {mask: dict(sizes) for mask, sizes in state.reusable.get(pod_id, {}).items()}
    regular_init = _is_regular_init(container_name, init_containers)
    for block in blocks:
        left = record.get(block.numa_affinity, {}).get(block.type, 0)
        if regular_init:
            # init containers run one after another: the largest one bounds what is left over
            record.setdefault(block.numa_affinity, {})[block.type] = max(left, block.size)
        elif left:
            record[block.numa_affinity][block.type] = max(0, left - block.size)
    others = {p: r for p, r in state.reusable.items() if p != pod_id}
    return {**others, pod_id: record} if record else others


def _shrink_init_blocks(pod_blocks: dict[str, tuple[Block, ...]], container_name: str,
                        init_containers: Sequence[InitContainer],
                        blocks: Sequence[Block]) -> None:
    """Take what ``blocks`` reused out of the earlier regular init containers' blocks."""
    for block in blocks:
        remaining = block.size
        for init in init_containers:
            if init.name == container_name or remaining == 0:
                break
            if init.restartable or init.name not in pod_blocks:
                continue
            shrunk = []
            for old in pod_blocks[init.name]:
                if old.size and old.type == block.type and old.numa_affinity == block.numa_affinity:
                    taken = min(old.size, remaining)
                    remaining -= taken
                    old = Block(old.numa_affinity, old.type, old.size - taken)
                shrunk.append(old)
            pod_blocks[init.name] = tuple(shrunk)
