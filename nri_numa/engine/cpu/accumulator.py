"""The kubelet's CPU accumulator: free CPUs, the orderings over them, and whole-unit takes.

§4.6 of docs/kubelet-algorithms.md. Every ordering lists only units that still hold a free CPU and
sorts "generically": fewest free CPUs first, ties by ascending id. Which of NUMA node and socket
is the outer level depends on the machine (``CPUTopology.numa_first``).

One deliberate difference from the Go code: a unit that appears twice in an ordering (a socket
that spans two NUMA nodes on a NUMA-first machine, an uncore cache that spans two NUMA nodes with
sub-NUMA clustering) is taken at most once. The kubelet would count such a unit's CPUs twice
against the request and hand back fewer CPUs than asked for.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from nri_numa.engine.cpu.topology import CPUTopology, bits_of

PACKED = "packed"
SPREAD = "spread"


class CPUAllocationError(ValueError):
    """The CPUs could not be chosen; the message is the kubelet's."""


class NotEnoughCPUsError(CPUAllocationError):
    """Fewer CPUs available than requested."""


class CPUAccumulator:
    """CPUs still free (``free``), CPUs taken (``result``), CPUs still wanted (``needed``)."""

    __slots__ = ("topo", "free", "result", "needed")

    def __init__(self, topo: CPUTopology, available: int, needed: int) -> None:
        self.topo = topo
        self.free = available & topo.all_cpus
        self.result = 0
        self.needed = needed

    # --- bookkeeping --------------------------------------------------------------------------

    def take(self, cpus: int) -> None:
        cpus &= self.free  # never count a CPU twice
        self.result |= cpus
        self.free &= ~cpus
        self.needed -= cpus.bit_count()

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > self.free.bit_count()

    def needs_at_least(self, n: int) -> bool:
        return self.needed >= n

    def free_in(self, mask: int) -> int:
        return (self.free & mask).bit_count()

    # --- orderings ----------------------------------------------------------------------------

    def _sorted(self, ids: Iterable[int], masks: Mapping[int, int], within: int = -1) -> list[int]:
        """Ids whose unit has a free CPU inside ``within``, fewest free CPUs (in the whole unit)
        first, then by id."""
        free = self.free
        # (count, id) pairs sort in C, without a key function called per unit.
        ranked = [((free & masks[i]).bit_count(), i) for i in ids if free & within & masks[i]]
        ranked.sort()
        return [i for _, i in ranked]

    def numa_order(self) -> list[int]:
        topo = self.topo
        if topo.numa_first:
            return self._sorted(topo.numa_cpus, topo.numa_cpus)
        return [n for s in self.socket_order()
                for n in self._sorted(topo.numas_of_socket[s], topo.numa_cpus, topo.socket_cpus[s])]

    def socket_order(self) -> list[int]:
        topo = self.topo
        if not topo.numa_first:
            return self._sorted(topo.socket_cpus, topo.socket_cpus)
        return [s for n in self.numa_order()
                for s in self._sorted(topo.sockets_of_numa[n], topo.socket_cpus, topo.numa_cpus[n])]

    def core_order(self) -> list[int]:
        return list(self._core_order())

    def _core_order(self) -> Iterator[int]:
        """``core_order`` made as it is read: the order of the outer units is fixed at the
        start, each unit's cores are counted when it is reached."""
        masks = self.topo.core_cpus
        for cores in self._core_groups():
            yield from self._fewest_free_first(cores, masks)

    def _fewest_free_first(self, ids: Sequence[int], masks: Mapping[int, int]) -> Iterator[int]:
        """``_sorted(ids, masks)`` without sorting: free CPUs are counted once per unit, then
        the units of each count come out in id order (ids ascend), fewest first."""
        free = self.free
        counts = [(free & masks[i]).bit_count() for i in ids]
        for count in sorted(set(counts)):
            if count:
                yield from itertools.compress(ids, map(count.__eq__, counts))

    def _core_groups(self) -> list[tuple[int, ...]]:
        """The cores of each outer unit (socket or NUMA node), the units in their order."""
        topo = self.topo
        if topo.numa_first:
            return [topo.cores_of_socket[s] for s in self.socket_order()]
        return [topo.cores_of_numa[n] for n in self.numa_order()]

    def uncore_order(self) -> list[int]:
        topo = self.topo
        return [u for n in self.numa_order()
                for u in self._sorted(topo.uncores_of_numa[n], topo.uncore_cpus, topo.numa_cpus[n])]

    def packed_cpu_order(self) -> list[int]:
        """Core by core in core order, each core's free CPUs ascending."""
        return [cpu for unit in self._remaining_units(PACKED) for cpu in bits_of(self.free & unit)]

    def spread_cpu_order(self) -> list[int]:
        """Socket by socket in socket order, each socket's free CPUs ascending (cores ignored)."""
        return [cpu for unit in self._remaining_units(SPREAD) for cpu in bits_of(self.free & unit)]

    def _remaining_units(self, strategy: str) -> Iterator[int]:
        """The CPU masks of the units whose free CPUs make the packed (cores in core order) or
        spread (sockets in socket order) CPU order, as they are read."""
        if strategy == PACKED:
            cores = self.topo.core_cpus
            return (cores[c] for c in self._core_order())
        sockets = self.topo.socket_cpus
        return (sockets[s] for s in self.socket_order())

    # --- free units ---------------------------------------------------------------------------

    def free_numa_nodes(self) -> list[int]:
        masks = self.topo.numa_cpus
        return [n for n in self.numa_order() if self.free_in(masks[n]) == masks[n].bit_count()]

    def free_sockets(self) -> list[int]:
        size = self.topo.cpus_per_socket
        masks = self.topo.socket_cpus
        return [s for s in self.socket_order() if self.free_in(masks[s]) == size]

    def free_cores(self) -> list[int]:
        return list(self._free_cores())

    def _free_cores(self) -> Iterator[int]:
        """``free_cores`` as it is read. In core order the cores with ``size`` free CPUs sit
        together, in id order, inside each outer unit: picking them out of the unsorted groups
        gives the same list."""
        size = self.topo.cpus_per_core
        masks = self.topo.core_cpus
        for cores in self._core_groups():
            for c in cores:
                if (self.free & masks[c]).bit_count() == size:
                    yield c

    def free_uncores(self) -> list[int]:
        masks = self.topo.uncore_cpus
        return [u for u in self.uncore_order() if self.free_in(masks[u]) == masks[u].bit_count()]

    # --- whole-unit takes ---------------------------------------------------------------------

    def _take_whole(self, ids: list[int], masks: Mapping[int, int]) -> None:
        for i in ids:
            unit = masks[i]
            if self.needed >= unit.bit_count() and self.free & unit == unit:
                self.take(unit)

    # A wholly free unit is only taken when at least its size is still needed: below the
    # smallest such unit the orderings need not be computed at all.

    def take_full_numa_nodes(self) -> None:
        if self.needs_at_least(self.topo.smallest_numa_node):
            self._take_whole(self.free_numa_nodes(), self.topo.numa_cpus)

    def take_full_sockets(self) -> None:
        if self.needs_at_least(self.topo.cpus_per_socket):
            self._take_whole(self.free_sockets(), self.topo.socket_cpus)

    def take_full_cores(self) -> None:
        # A listed core that is wholly free has exactly ``size`` CPUs, so once less than that is
        # needed no later one can be taken. Reading the list while taking gives the list made
        # first: a take only changes the cores taken, which a second listing (a socket that is
        # in two NUMA nodes) would skip anyway.
        size = self.topo.cpus_per_core
        masks = self.topo.core_cpus
        if self.needed < size:
            return
        for c in self._free_cores():
            unit = masks[c]
            if self.free & unit == unit:
                self.take(unit)
                if self.needed < size:
                    return

    def take_full_uncores(self) -> None:
        self._take_whole(self.free_uncores(), self.topo.uncore_cpus)

    def take_full_first_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_numa_nodes()
        else:
            self.take_full_sockets()

    def take_full_second_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_sockets()
        else:
            self.take_full_numa_nodes()

    def take_partial_uncore(self, uncore: int) -> None:
        """Take exactly what is still needed from the lowest-numbered cores of one uncore cache,
        or nothing if they do not add up to exactly that."""
        topo = self.topo
        per_core = topo.cpus_per_core
        cores_needed = -(-self.needed // per_core)
        in_uncore = self.free & topo.uncore_cpus[uncore]
        cores = sorted({topo.core_of_cpu[cpu] for cpu in bits_of(in_uncore)})[:cores_needed]
        cpus = 0
        for c in cores:
            cpus |= self.free & topo.core_cpus[c]
        if self.needed % 2 and per_core > 1 and cpus.bit_count() > self.needed:
            cpus ^= 1 << (cpus.bit_length() - 1)  # an odd request leaves the highest CPU out
        if cpus.bit_count() == self.needed:
            self.take(cpus)

    def take_uncore_caches(self) -> None:
        # The kubelet retries the whole-cache take before each partial take; only the first try
        # can take anything (the need only shrinks, and no cache becomes wholly free), so it
        # runs once here: same result, without re-sorting every cache per cache.
        order = self.uncore_order()
        if self.needs_at_least(self.topo.cpus_per_uncore):
            self.take_full_uncores()
        for uncore in order:
            if self.satisfied():
                return
            self.take_partial_uncore(uncore)

    def take_remaining(self, strategy: str) -> None:
        """CPUs one at a time in packed (or spread) CPU order until satisfied.

        The kubelet lists the whole order before the first take. Here units are read as they
        are reached, which takes the same CPUs: a take only changes the unit taken from, and a
        unit listed twice (a socket in two NUMA nodes) has nothing left the second time. Most
        requests are done within the first unit or two, long before the order is complete.
        """
        for unit in self._remaining_units(strategy):
            for cpu in bits_of(self.free & unit):
                self.take(1 << cpu)
                if self.satisfied():
                    return


def new_accumulator(topology: CPUTopology, free: int, count: int) -> CPUAccumulator | None:
    """An accumulator for ``count`` CPUs, or None when nothing is wanted.

    Raises NotEnoughCPUsError when the free CPUs (as the topology knows them) are too few.
    """
    acc = CPUAccumulator(topology, free, count)
    if acc.satisfied():
        return None
    if acc.failed():
        raise NotEnoughCPUsError(
            "not enough cpus available to satisfy request: "
            f"requested={count}, available={free.bit_count()}")
    return acc
