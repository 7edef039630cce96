"""The CPU Manager's algorithms: the CPU layout, choosing exclusive CPUs, CPU topology hints."""

from nri_numa.engine.cpu.hints import cpu_hints
from nri_numa.engine.cpu.take import CPUAllocationError, NotEnoughCPUsError, take_cpus
from nri_numa.engine.cpu.topology import CPUInfo, CPUTopology, CPUTopologyError, cpu_topology

__all__ = [
    "CPUAllocationError", "CPUInfo", "CPUTopology", "CPUTopologyError", "NotEnoughCPUsError",
    "cpu_hints", "cpu_topology", "take_cpus",
]
