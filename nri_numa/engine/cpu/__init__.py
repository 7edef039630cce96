"""The CPU Manager's algorithms: the CPU layout, choosing exclusive CPUs, CPU topology hints."""

from nri_numa.engine.cpu.hints import cpu_hints, cpu_hints_for_masks
from nri_numa.engine.cpu.take import (CPUAllocationError, NotEnoughCPUsError, take_cpu_mask,
                                      take_cpus)
from nri_numa.engine.cpu.topology import (CPUInfo, CPUTopology, CPUTopologyError, checked_mask,
                                          cpu_topology, set_of)

__all__ = [
    "CPUAllocationError", "CPUInfo", "CPUTopology", "CPUTopologyError", "NotEnoughCPUsError",
    "checked_mask", "cpu_hints", "cpu_hints_for_masks", "cpu_topology", "set_of",
    "take_cpu_mask", "take_cpus",
]
