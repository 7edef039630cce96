"""Synthetic machines: describe one (``MachineSpec``), build its ``Topology``, write it as a fake
sysfs tree with a fake NVML description that ``discover`` reads back to the same ``Topology``."""

from nri_numa.topology.discover import FAKE_NVML_FILE
from nri_numa.topology.synthetic.build import build_topology, gpu_uuid
from nri_numa.topology.synthetic.presets import PRESETS, Preset, preset_topology
from nri_numa.topology.synthetic.spec import (
    CpulessNodeSpec,
    DistanceSpec,
    GpuSpec,
    MachineSpec,
    MemorySpec,
    NicKind,
    NicSpec,
    Numbering,
    NvLinkBridgeSpec,
    NvSwitchSpec,
    PcieSwitchSpec,
    RootPortNicSpec,
    SmtLayout,
    SpecError,
)
from nri_numa.topology.synthetic.sysfs_writer import WriteTreeError, write_tree

__all__ = [
    "FAKE_NVML_FILE", "PRESETS", "CpulessNodeSpec", "DistanceSpec", "GpuSpec", "MachineSpec",
    "MemorySpec", "NicKind", "NicSpec", "Numbering", "NvLinkBridgeSpec", "NvSwitchSpec",
    "PcieSwitchSpec", "Preset", "RootPortNicSpec", "SmtLayout", "SpecError", "WriteTreeError",
    "build_topology", "gpu_uuid", "preset_topology", "write_tree",
]
