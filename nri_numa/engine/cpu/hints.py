"""CPU topology hints: the kubelet's generateCPUTopologyHints (§4.9 of docs/kubelet-algorithms.md).

``cpu_hints(topology, available, reusable, request)`` lists the NUMA masks that could hold
``request`` exclusive CPUs, in the kubelet's IterateBitMasks order (by size, then
lexicographically by node id):

* a mask is left out if a ``reusable`` CPU (one this pod's finished init containers hold) lies
  outside it, or if the reusable CPUs plus the ``available`` CPUs on it are fewer than
  ``request`` (a CPU given as both counts twice, as in the kubelet);
* a hint is preferred when its size is the fewest NUMA nodes whose CPUs — all of them, free or
  not — could hold the request ("min affinity"), or, with ``align_by_socket``, when its nodes span
  exactly as many sockets as min affinity needs (NUMA nodes per socket = nodes // sockets).

Masks range over the NUMA nodes that have CPUs (memory-only nodes never appear, as in the
kubelet). CPUs the topology does not know are ignored (the kubelet would count them on node 0).
``request`` 0 gives ``None`` (no preference); a request no mask can hold gives ``[]``.

Regenerating the hints of a container that already holds CPUs is the caller's business, as in
the kubelet: pass those CPUs as ``available`` and nothing as ``reusable``.

Up to EXACT_NODE_LIMIT NUMA nodes every mask is listed, as in the kubelet: 4,095 at 12 nodes.
Listing all 65,535 of 16 nodes at every admission would cost far more than the admission
(bench/bench_cpu.py times it; bench/README.md). Past the limit
the list holds, still in kubelet order, every hint of the narrowest widths — from the narrowest
mask that fits up to min affinity (and, with ``align_by_socket``, up to the widest socket-aligned
width) — at most MAX_LISTED_HINTS of them after looking at no more than MAX_VISITED_MASKS masks,
then the all-nodes hint. Where a cap cuts into a width, the masks of smallest integer value are
kept: the merge ranks masks of one width that way (when prefer-closest-numa-nodes is off). Within
the caps that is every hint that can be preferred and the narrowest non-preferred ones; wider
non-preferred hints are left out. The all-nodes hint stands in
for them in a merge: ANDed with another resource's mask it gives that mask, so whatever another
resource alone could reach stays reachable.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from nri_numa.engine.bitmask import bits, kubelet_order, mask_of, subset_sums
from nri_numa.engine.cpu.topology import CPUTopology, checked_mask
from nri_numa.engine.hints import Hint, hint_of_mask, hints_of_masks

EXACT_NODE_LIMIT = 12
MAX_LISTED_HINTS = 512
MAX_VISITED_MASKS = 4096


def cpu_hints(topology: CPUTopology, available: Iterable[int], reusable: Iterable[int],
              request: int, *, align_by_socket: bool = False) -> list[Hint] | None:
    """The hints, ``None`` for no request; ValueError for a bad request or CPU ids."""
    _check_request(request)
    if request == 0:
        return None
    return cpu_hints_for_masks(topology, checked_mask(available, "available"),
                               checked_mask(reusable, "reusable"), request,
                               align_by_socket=align_by_socket)


def cpu_hints_for_masks(topology: CPUTopology, available: int, reusable: int, request: int, *,
                        align_by_socket: bool = False) -> list[Hint] | None:
    """``cpu_hints`` for callers that hold CPU sets as bit masks (bit n = CPU n)."""
    _check_request(request)
    if request == 0:
        return None
    space = _HintSpace(topology, available, reusable, request)
    min_affinity = space.min_affinity()
    if len(space.nodes) <= EXACT_NODE_LIMIT:
        masks = space.all_masks()
    else:
        masks = space.narrow_masks(min_affinity, align_by_socket)
    if not align_by_socket:
        return hints_of_masks(masks, min_affinity)
    preferred = _socket_aligned_preference(topology, min_affinity)
    return [hint_of_mask(mask, preferred(mask)) for mask in masks]


def _check_request(request: int) -> None:
    if isinstance(request, bool) or not isinstance(request, int) or request < 0:
        raise ValueError(f"CPU request must be a non-negative integer, not {request!r}")


class _HintSpace:
    """Per-node counts the hint rules need; masks are ints over NUMA node ids."""

    def __init__(self, topology: CPUTopology, free: int, reusable: int, request: int) -> None:
        held = reusable & topology.all_cpus
        self.topology = topology
        self.nodes = topology.numa_ids
        self.request = request
        numa_cpus = topology.numa_cpus
        self.free = {n: (free & numa_cpus[n]).bit_count() for n in self.nodes}
        self.held = [n for n in self.nodes if held & numa_cpus[n]]  # every mask must hold them
        self.wanted = request - held.bit_count()  # what available CPUs must add

    def min_affinity(self) -> int:
        """The fewest nodes whose CPUs could hold the request (all nodes if none can): a mask of
        k nodes can exactly when the k biggest nodes can."""
        biggest = self.topology.biggest_numa_nodes_cpus
        return min(bisect_left(biggest, self.request) + 1, len(self.nodes))

    def all_masks(self) -> list[int]:
        """Every mask that is a hint, as the kubelet walks them."""
        nodes = self.nodes
        free = subset_sums([self.free[n] for n in nodes])
        held = mask_of(nodes.index(n) for n in self.held)
        wanted = self.wanted
        order = kubelet_order(len(nodes))
        if held:
            fits = [m for m in order if free[m] >= wanted and m & held == held]
        else:  # the usual case, without the test that always holds (255 masks on 8 nodes)
            fits = [m for m in order if free[m] >= wanted]
        if nodes == tuple(range(len(nodes))):
            return fits
        return [mask_of(nodes[i] for i in bits(m)) for m in fits]

    def narrowest_fit(self) -> int | None:
        """Size of the narrowest mask that is a hint: the held nodes plus the freest others."""
        wanted = self.wanted - sum(self.free[n] for n in self.held)
        others = sorted((self.free[n] for n in self.nodes if n not in self.held), reverse=True)
        for extra, total in enumerate(accumulate(others, initial=0)):
            if total >= wanted:
                return max(len(self.held) + extra, 1)
        return None

    def narrow_masks(self, min_affinity: int, align_by_socket: bool) -> list[int]:
        narrowest = self.narrowest_fit()
        if narrowest is None:
            return []
        widest = max(narrowest, min_affinity)
        if align_by_socket:
            widest = max(widest, self._widest_socket_aligned(min_affinity))
        out: list[int] = []
        visited = 0
        for size in range(narrowest, min(widest, len(self.nodes)) + 1):
            fits = []
            for mask, free in self._masks_by_value(size):
                visited += 1
                if free >= self.wanted:
                    fits.append(mask)
                if len(out) + len(fits) >= MAX_LISTED_HINTS or visited >= MAX_VISITED_MASKS:
                    break
            out.extend(sorted(fits, key=bits))  # kubelet order within a size: lexicographic
            if len(out) >= MAX_LISTED_HINTS or visited >= MAX_VISITED_MASKS:
                break
        return self._with_all_nodes(out)

    def _masks_by_value(self, size: int) -> Iterator[tuple[int, int]]:
        """(mask, its free CPUs) for the masks of ``size`` nodes holding the held nodes, smallest
        integer value first (the order the merge ranks masks of one size in, so a cap keeps the
        ones it would pick)."""
        others = [n for n in self.nodes if n not in self.held]
        free_slots = size - len(self.held)
        if not 0 <= free_slots <= len(others):
            return
        base = mask_of(self.held)
        base_free = sum(self.free[n] for n in self.held)
        node_bit = [1 << n for n in others]
        node_free = [self.free[n] for n in others]
        chosen = (1 << free_slots) - 1  # over positions in ``others``
        while chosen < 1 << len(others):
            mask, free, rest = base, base_free, chosen
            while rest:
                low = rest & -rest
                i = low.bit_length() - 1
                mask |= node_bit[i]
                free += node_free[i]
                rest ^= low
            yield mask, free
            if not chosen:
                return
            # Gosper's hack: the next larger integer with as many bits set.
            low = chosen & -chosen
            ripple = chosen + low
            chosen = ripple | (((chosen ^ ripple) >> 2) // low)

    def _with_all_nodes(self, masks: list[int]) -> list[int]:
        every = mask_of(self.nodes)
        if (not masks or masks[-1] != every) and sum(self.free.values()) >= self.wanted:
            masks.append(every)
        return masks

    def _widest_socket_aligned(self, min_affinity: int) -> int:
        """Most nodes a mask spanning exactly the socket-aligned number of sockets can have."""
        min_sockets = _min_sockets(self.topology, min_affinity)
        per_socket = sorted((len(n) for n in self.topology.numas_of_socket.values()), reverse=True)
        return sum(per_socket[:min_sockets])


def _min_sockets(topology: CPUTopology, min_affinity: int) -> int:
    """Sockets a socket-aligned hint spans; 0 (never aligned) with fewer nodes than sockets."""
    per_socket = topology.num_numa_nodes // topology.num_sockets
    return -(-min_affinity // per_socket) if per_socket else 0


def _socket_aligned_preference(topology: CPUTopology, min_affinity: int) -> Callable[[int], bool]:
    """With align-by-socket, a mask is also preferred when it spans the socket-aligned number
    of sockets."""
    min_sockets = _min_sockets(topology, min_affinity)

    def preferred(mask: int) -> bool:
        if min_sockets and len(topology.sockets_of_numa_nodes(bits(mask))) == min_sockets:
            return True
        return mask.bit_count() == min_affinity

    return preferred
