"""The placement engine: pure functions from topology, allocations and request to a decision.

The kubelet-compatible core, for reuse by other tools (docs/engine.md):

- ``Hint``, ``merge_hints`` — the Topology Manager's hint merge, all four policies;
- ``cpu_topology``, ``take_cpus``, ``cpu_hints`` — the static CPU Manager's algorithms;
- ``EngineContext``, ``admit``, ``release`` — whole admissions against an ``Allocations`` value.
"""

from nri_numa.engine.hints import Hint, MergeError
from nri_numa.engine.merge import merge_hints
from nri_numa.engine.policy.options import PolicyOptionError
from nri_numa.engine.cpu import (CPUAllocationError, CPUTopology, NotEnoughCPUsError, cpu_hints,
                                 cpu_topology, take_cpus)
from nri_numa.engine.allocations import Allocations, AllocationsError
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Decision, Placement, Rejection
from nri_numa.engine.admit import Admission, admit, release

__all__ = [
    "Admission", "Allocations", "AllocationsError", "CPUAllocationError", "CPUTopology",
    "Decision", "EngineContext", "Hint", "MergeError", "NotEnoughCPUsError", "Placement",
    "PolicyOptionError", "Rejection", "admit", "cpu_hints", "cpu_topology", "merge_hints",
    "release", "take_cpus",
]
