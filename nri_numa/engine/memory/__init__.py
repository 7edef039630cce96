"""The Memory Manager's static policy, as pure functions over an immutable ``MemoryState``.

Same answers as the kubelet's (docs/kubelet-algorithms.md §5): ``memory_hints`` and friends give the
topology manager its memory hints, ``allocate`` places a container's memory and hugepages on the
chosen NUMA nodes, ``remove`` gives them back. Every operation takes a state and returns a new one;
the ledger stores it and makes operations transactional.
"""

from nri_numa.engine.memory.allocate import MemoryAllocationError, adopt, allocate, remove
from nri_numa.engine.memory.hints import (
    best_hint,
    container_hints,
    memory_hints,
    pod_hints,
    regenerate_hints,
)
from nri_numa.engine.memory.nodes import MemoryTable, NodeState, machine_state_difference
from nri_numa.engine.memory.resources import (
    MEMORY,
    InitContainer,
    MemoryRequestError,
    is_memory_resource,
    requested_resources,
)
from nri_numa.engine.memory.state import (
    Block,
    MemoryState,
    MemoryStateError,
    ReservedMemoryError,
    check_reserved_memory,
    restore,
)

__all__ = [
    "MEMORY", "Block", "InitContainer", "MemoryAllocationError", "MemoryRequestError",
    "MemoryState", "MemoryStateError", "MemoryTable", "NodeState", "ReservedMemoryError",
    "adopt", "allocate", "best_hint", "check_reserved_memory", "container_hints", "is_memory_resource",
    "machine_state_difference", "memory_hints", "pod_hints", "regenerate_hints", "remove",
    "requested_resources", "restore",
]
