"""takeByTopologyNUMAPacked (§4.7 of docs/kubelet-algorithms.md)."""

from __future__ import annotations

from nri_numa.engine.cpu.accumulator import PACKED, SPREAD, CPUAllocationError, new_accumulator
from nri_numa.engine.cpu.topology import CPUTopology


def take_packed(topology: CPUTopology, free: int, count: int, strategy: str = PACKED,
                align_by_uncore_cache: bool = False) -> int:
    """takeByTopologyNUMAPacked: the chosen CPUs as a bit mask."""
    acc = new_accumulator(topology, free, count)
    if acc is None:
        return 0
    steps = [acc.take_full_first_level, acc.take_full_second_level]
    if align_by_uncore_cache:
        steps.append(acc.take_uncore_caches)
    if strategy != SPREAD:
        steps.append(acc.take_full_cores)
    steps.append(lambda: acc.take_remaining(strategy))
    for step in steps:
        step()
        if acc.satisfied():
            return acc.result
    raise CPUAllocationError("failed to allocate cpus")
