"""Device Manager topology hints (§6 of docs/kubelet-algorithms.md), one resource at a time.

``device_hints`` answers for a container, ``pod_device_hints`` for a whole pod (pod scope; the
pod's request comes from ``nri_numa.engine.request.pod_device_requests``). The answer is
``None`` (no preference: the resource has no device with a NUMA node), ``[]`` (cannot be
satisfied: the topology manager then admits nowhere preferred) or the hints:

* every NUMA mask in ``iterate_masks`` order whose devices could serve the request: the reusable
  devices (from this pod's finished init containers) plus the available devices touching the mask
  number at least the request, and no reusable device with a NUMA node lies outside the mask;
* preferred are the masks of the fewest nodes that hold enough of the resource's devices,
  healthy or not, free or not: what an empty machine could do.

A device touches a mask when any of its NUMA nodes is in it; a device without NUMA nodes touches
none. Devices already allocated to the container (the pod) regenerate its hints from exactly
those devices, or give ``[]`` when their number no longer matches the request.

One difference that cannot show: the kubelet tells a device with no topology (nil) from one whose
topology lists no node, and while generating hints treats a reusable device of the second kind as
fitting no mask. A ``Device`` without NUMA nodes is always the first kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from nri_numa.engine.bitmask import bits, kubelet_order, subset_sums
from nri_numa.engine.devices import Resource
from nri_numa.engine.hints import Hint, hints_of_masks


def device_hints(resource: Resource, request: int, numa_nodes: Sequence[int], *,
                 allocated_to_others: Collection[str] = frozenset(),
                 allocated_here: Collection[str] = frozenset(),
                 reusable: Collection[str] = frozenset()) -> list[Hint] | None:
    """The container's hints for ``request`` devices of ``resource``.

    ``allocated_to_others``: ids held by any other container (this pod's init containers
    included); ids of this container may be in it too, it makes no difference.
    ``allocated_here``: ids this container already holds. ``reusable``: ids this pod's finished
    init containers hold, which this container may take over. ``numa_nodes``: the machine's
    NUMA node ids, ascending.
    """
    if request < 0:
        raise ValueError(f"resource {resource.name}: cannot request {request} devices")
    if not resource.has_topology:
        return None
    held = frozenset(allocated_here)
    if held:
        if len(held) != request:
            return []
        return generate_hints(resource, held, frozenset(), request, numa_nodes)
    available = resource.healthy_ids - frozenset(allocated_to_others)
    reusable = frozenset(reusable)
    if len(available | reusable) < request:
        return []
    return generate_hints(resource, available, reusable, request, numa_nodes)


def pod_device_hints(resource: Resource, request: int, numa_nodes: Sequence[int], *,
                     allocated_to_others: Collection[str] = frozenset(),
                     allocated_to_pod: Collection[str] = frozenset()) -> list[Hint] | None:
    """The pod's hints (pod scope): the container flow with the devices of every container of
    the pod as the devices already held, and no reusable devices."""
    return device_hints(resource, request, numa_nodes, allocated_to_others=allocated_to_others,
                        allocated_here=allocated_to_pod)


def generate_hints(resource: Resource, available: Collection[str], reusable: Collection[str],
                   request: int, numa_nodes: Sequence[int]) -> list[Hint]:
    """Hints from ``available`` plus ``reusable`` devices, preferred set as the kubelet sets it.

    Unknown ids count as devices without NUMA nodes (the kubelet finds no topology for them).
    """
    # Masks here are over positions in numa_nodes; a device touches a mask through its nodes
    # that are on the list (one elsewhere touches none), so counts per mask come from a table
    # over every mask instead of a walk over the devices for each.
    nodes = tuple(numa_nodes)
    position = {node: p for p, node in enumerate(nodes)}

    def positions(device_nodes: Collection[int]) -> int:
        return sum(1 << position[n] for n in device_nodes if n in position)

    # The kubelet skips reusable devices without topology here: they neither rule a mask out
    # nor count towards it (they did count in the caller's "enough devices at all" check).
    placed = [positions(found) for found in map(resource.numa_nodes_of, reusable) if found]
    order = kubelet_order(len(nodes))
    every = _touching((positions(d.numa_nodes) for d in resource.devices), len(nodes))
    min_affinity = next((m.bit_count() for m in order if every[m] >= request), len(nodes))
    offered = _touching((positions(resource.numa_nodes_of(d)) for d in available), len(nodes))
    wanted = request - len(placed)
    fitting = [m for m in order if offered[m] >= wanted]
    if placed:
        fitting = [m for m in fitting if all(p & m for p in placed)]
    if nodes != tuple(range(len(nodes))):
        fitting = [sum(1 << nodes[p] for p in bits(m)) for m in fitting]
    return hints_of_masks(fitting, min_affinity)


def _touching(device_masks: Iterable[int], width: int) -> list[int]:
    """For every mask over ``width`` positions, how many of the devices have a node in it."""
    masks = [m for m in device_masks if m]
    if all(m & (m - 1) == 0 for m in masks):
        # Each device on one node: a mask's count is the sum of its nodes' counts.
        per_node = [0] * width
        for m in masks:
            per_node[m.bit_length() - 1] += 1
        return subset_sums(per_node)
    # A device on several nodes touches a mask through any of them: count by distinct masks.
    groups = Counter(masks)
    return [sum(count for device, count in groups.items() if device & mask)
            for mask in range(1 << width)]
