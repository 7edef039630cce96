"""The values the demo reads back and reasons about: one row per container, the facts of the
machine it ran on, and the whole outcome of a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nri_numa.topology.cpulist import parse_list

GUARANTEED, BURSTABLE, BESTEFFORT = "Guaranteed", "Burstable", "BestEffort"


@dataclass(frozen=True)
class Row:
    """Where one container landed, as read back: its cgroup's cpuset files from the host and the
    kernel's allowed lists from inside the container. The strings are exactly what was read."""

    pod: str
    qos: str  # GUARANTEED, BURSTABLE or BESTEFFORT
    asked: str  # the resources in words, e.g. "cpu 1, memory 64Mi (requests = limits)"
    exclusive_cpus_asked: int  # whole CPUs a Guaranteed pod asks for; 0 for the others
    cgroup: str  # the container's cgroup path (linux.cgroupsPath)
    cpus: str  # cpuset.cpus
    mems: str  # cpuset.mems
    inside_cpus: str  # Cpus_allowed_list
    inside_mems: str  # Mems_allowed_list

    @property
    def cpu_ids(self) -> frozenset[int]:
        return parse_list(self.cpus)

    @property
    def mem_ids(self) -> frozenset[int]:
        return parse_list(self.mems)

    @property
    def inside_cpu_ids(self) -> frozenset[int]:
        return parse_list(self.inside_cpus)

    @property
    def inside_mem_ids(self) -> frozenset[int]:
        return parse_list(self.inside_mems)


@dataclass(frozen=True)
class MachineFacts:
    """What the checks need to know about the machine: its online CPUs, the NUMA node of each,
    and the CPUs the configuration reserves."""

    online: frozenset[int]
    node_of: Mapping[int, int]  # CPU id -> NUMA node id
    reserved: frozenset[int]

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset(self.node_of.values())


@dataclass(frozen=True)
class DemoResult:
    """One run of the demo: the rows (in QoS order), what the BestEffort container ran on before
    the Guaranteed pod came, the plugin's own placement lines, and what clean-up could not do."""

    containerd_version: str
    machine: MachineFacts
    config: Mapping[str, str]
    cgroup_mount: Path  # where the rows' cgroup paths are, e.g. /sys/fs/cgroup/cpuset
    rows: tuple[Row, ...]
    besteffort_before: str  # cpuset.cpus of the BestEffort container before the Guaranteed pod
    plugin_lines: tuple[str, ...]
    workdir: Path  # removed by the clean-up
    seconds: float
    cleanup_problems: tuple[str, ...] = field(default=())
