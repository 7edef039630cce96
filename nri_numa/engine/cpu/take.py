"""Choosing exclusive CPUs: the kubelet's takeByTopology (§4.5, 4.7, 4.8 of
docs/kubelet-algorithms.md).

``take_cpus`` picks ``count`` CPUs out of ``available`` the way the static CPU Manager policy
does with the given options:

* packed (default): whole NUMA nodes / sockets (bigger unit first), then — with
  ``align_by_uncore_cache`` (prefer-align-cpus-by-uncorecache) — whole and partial uncore caches,
  then whole cores, then single CPUs core by core;
* ``spread_across_cores`` (distribute-cpus-across-cores): the same without the whole-core step,
  single CPUs socket by socket in id order, so siblings are used last;
* ``distribute_across_numa`` (distribute-cpus-across-numa): spread the request evenly, in groups
  of ``cpu_group_size`` CPUs (the CPUs of a core under full-pcpus-only), over the fewest NUMA
  nodes that can hold it, keeping the free CPUs of all nodes as balanced as possible
  (see ``distributed.py``).

Option pairs the kubelet refuses to combine are refused here with its message.
"""

from __future__ import annotations

from collections.abc import Iterable

from nri_numa.engine.cpu.accumulator import PACKED, SPREAD, CPUAllocationError, NotEnoughCPUsError
from nri_numa.engine.cpu.packed import take_packed
from nri_numa.engine.cpu.topology import CPUTopology, checked_mask, set_of

__all__ = ["CPUAllocationError", "NotEnoughCPUsError", "take_cpu_mask", "take_cpus"]

DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
ALIGN_BY_UNCORE_CACHE = "prefer-align-cpus-by-uncorecache"


def take_cpus(topology: CPUTopology, available: Iterable[int], count: int, *,
              distribute_across_numa: bool = False, cpu_group_size: int = 1,
              spread_across_cores: bool = False,
              align_by_uncore_cache: bool = False) -> frozenset[int]:
    """``count`` CPUs from ``available`` (CPUs the topology does not know are ignored).

    Raises NotEnoughCPUsError when fewer than ``count`` of them exist, CPUAllocationError if the
    algorithm cannot finish, ValueError for a negative count, a group size below 1, something
    other than CPU ids in ``available``, or an option pair the kubelet refuses.
    """
    _check_options(count, cpu_group_size, distribute_across_numa, spread_across_cores,
                   align_by_uncore_cache)
    return set_of(_take(topology, checked_mask(available, "available"), count,
                        distribute_across_numa, cpu_group_size, spread_across_cores,
                        align_by_uncore_cache))


def take_cpu_mask(topology: CPUTopology, available: int, count: int, *,
                  distribute_across_numa: bool = False, cpu_group_size: int = 1,
                  spread_across_cores: bool = False, align_by_uncore_cache: bool = False) -> int:
    """``take_cpus`` for callers that hold CPU sets as bit masks (bit n = CPU n): the same
    choice and errors, without converting ``available`` and the answer."""
    _check_options(count, cpu_group_size, distribute_across_numa, spread_across_cores,
                   align_by_uncore_cache)
    return _take(topology, available, count, distribute_across_numa, cpu_group_size,
                 spread_across_cores, align_by_uncore_cache)


def _take(topology: CPUTopology, free: int, count: int, distribute_across_numa: bool,
          cpu_group_size: int, spread_across_cores: bool, align_by_uncore_cache: bool) -> int:
    strategy = SPREAD if spread_across_cores else PACKED
    if distribute_across_numa:  # the option is rare: its module loads on first use
        from nri_numa.engine.cpu.distributed import take_distributed

        return take_distributed(topology, free, count, cpu_group_size, strategy)
    return take_packed(topology, free, count, strategy, align_by_uncore_cache)


def _check_options(count: int, group: int, numa: bool, cores: bool, uncore: bool) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"CPU count must be a non-negative integer, not {count!r}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"cpu_group_size must be a positive integer, not {group!r}")
    refused = [(numa and cores, DISTRIBUTE_ACROSS_NUMA, DISTRIBUTE_ACROSS_CORES),
               (uncore and cores, ALIGN_BY_UNCORE_CACHE, DISTRIBUTE_ACROSS_CORES),
               (uncore and numa, ALIGN_BY_UNCORE_CACHE, DISTRIBUTE_ACROSS_NUMA)]
    for both, a, b in refused:
        if both:
            raise ValueError(f"static policy options {a} and {b} can not be used at the same time")
