"""The machine: an immutable model, its JSON form, and discovery from sysfs, NVML and netlink."""

from nri_numa.topology.discover import discover
from nri_numa.topology.model import SCHEMA_VERSION, Topology, TopologyFormatError
from nri_numa.topology.parts import (
    PCIE_LEVELS,
    Cpu,
    Gpu,
    HugePages,
    Nic,
    NumaNode,
    PciDevice,
    pcie_level,
)

__all__ = [
    "PCIE_LEVELS", "SCHEMA_VERSION", "Cpu", "Gpu", "HugePages", "Nic", "NumaNode", "PciDevice",
    "Topology", "TopologyFormatError", "discover", "pcie_level",
]
