"""``nri-numa state``: what the checkpoint says is placed, and where the cgroups disagree.

The checkpoint is read and never written: no lock is taken (the plugin replaces the snapshot by
an atomic rename, so a reader sees one whole version, and appends its journal's records whole;
a torn last record is left out, and a journal already replaced by a compaction is not
replayed, which shows the snapshot's older state), and a file that cannot be trusted is
reported, not set aside as the plugin would. It is read as the agents read it: not through a
symlink, never waiting on a FIFO, bounded in size and in JSON nesting. Both ledgers are read: the NRI plugin's
(``nri-numa run``, /var/lib/nri-numa) and the OCI hook's (/run/nri-numa), which adds a process
table holding each container's cgroup.

Drift: a container whose cgroup's ``cpuset.cpus`` is not what the ledger gives it (its exclusive
CPUs, or the shared pool as it is now), or whose ``cpuset.mems`` is not the memory nodes it was
placed on. A container whose cgroup is not found is listed as such: not drift, since a created
container has no cgroup until it starts. Right after a change the runtime may still be applying
the cpusets the plugin sent, so a drift seen once is worth a second look.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nri_numa.engine.allocations import Allocations, AllocationsError
from nri_numa.engine.memory import MemoryState
from nri_numa.engine.request import QosClass
from nri_numa.hook.shared_ledger import PROCESSES_KEY
from nri_numa.runtime.cpuset_cgroups import CgroupReading, CpusetTree, find_cpuset_tree, locate_all, readings
from nri_numa.runtime.to_request import qos_from_cgroup_parent
from nri_numa.safeio.safe_files import UnusableFile, open_folder, read_regular
from nri_numa.state.checkpoint import (FILE_NAME, MAX_BYTES, UntrustedCheckpoint,
                                       current_boot_id, read_envelope)
from nri_numa.state.ledger import LEDGER_VERSION
from nri_numa.state.plugin_checkpoint import UntrustedState, read_state
from nri_numa.state.plugin_records import (ContainerRecord, PodRecord, RecordError,
                                           records_from_dict)
from nri_numa.state.recorded_config import PAYLOAD_KEY as CONFIG_KEY
from nri_numa.state.recorded_config import RecordedConfig
from nri_numa.topology.cpulist import format_list


class StateViewError(Exception):
    """The state cannot be shown: missing, unreadable or untrusted. One line, says why."""


@dataclass(frozen=True, slots=True)
class MemoryHeld:
    """One of the Memory Manager's blocks: ``size`` bytes of ``resource`` on ``nodes``."""

    resource: str  # "memory", "hugepages-2Mi", …
    nodes: tuple[int, ...]
    size: int


@dataclass(frozen=True, slots=True)
class ContainerView:
    id: str
    pod: PodRecord | None  # None: the checkpoint lacks the pod record (it should not)
    name: str
    qos: QosClass | None  # None outside Kubernetes (no kubelet cgroup parent)
    exclusive: bool
    in_ledger: bool  # False: adopted, did not fit; follows the pool (may still hold devices)
    cpus: frozenset[int]  # what the ledger gives it now: its own CPUs, or the shared pool
    mems: frozenset[int] | None  # None: its memory nodes are left alone
    memory: tuple[MemoryHeld, ...]
    devices: Mapping[str, tuple[str, ...]]  # allocated by the engine (hook, device plugins)
    device_nodes: Mapping[str, frozenset[int]]  # given by the runtime: resource → NUMA nodes
    cgroup: CgroupReading
    drift: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))
        object.__setattr__(self, "device_nodes", MappingProxyType(dict(self.device_nodes)))


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """One NUMA node's table for one resource, as the Memory Manager keeps it."""

    node: int
    resource: str
    allocatable: int
    reserved: int  # held by containers


@dataclass(frozen=True, slots=True)
class StateView:
    path: Path
    kind: str  # "nri" (nri-numa run) or "hook" (nri-numa hook)
    written: float  # the file's modification time
    shared: frozenset[int]
    reserved: frozenset[int] | None  # None: not recorded, and no --config given
    cgroups: CpusetTree | None
    containers: tuple[ContainerView, ...]
    node_memory: tuple[NodeMemory, ...] = ()
    notes: tuple[str, ...] = field(default=())
    recorded: RecordedConfig | None = None  # the policies the placements were made under

    @property
    def drifted(self) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.drift)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A trusted checkpoint's contents, decoded."""

    allocations: Allocations
    pods: dict[str, PodRecord]
    containers: dict[str, ContainerRecord]
    hook_cgroups: dict[str, str | None] | None  # hook only: container id → cgroup (None: pending)
    machine: str
    written: float
    recorded: RecordedConfig | None = None  # absent from the hook's and older checkpoints


def read_checkpoint(state_dir: Path, boot_id: str | None = None) -> Checkpoint:
    """The checkpoint in ``state_dir``, checked as the plugin checks it (format, version,
    checksum, this boot) except the machine (``check_machine``); StateViewError otherwise."""
    path = state_dir / FILE_NAME
    try:
        folder = open_folder(state_dir)
        try:
            contents = None if folder is None else read_regular(FILE_NAME, folder, MAX_BYTES,
                                                                  path)
        finally:
            if folder is not None:
                os.close(folder)
    except UnusableFile as e:
        raise StateViewError(str(e)) from None
    if contents is None:
        hint = "" if folder is not None else f" ({state_dir} does not exist)"
        raise StateViewError(f"no checkpoint at {path}{hint}: nri-numa has placed nothing there "
                             "yet, or give the --state-dir it runs with") from None
    raw, written = contents.data, contents.mtime
    envelope = _envelope(raw, path, boot_id or current_boot_id())
    try:  # the NRI plugin's changes since its snapshot (nri_numa.state.plugin_checkpoint)
        payload, journal_written = read_state(state_dir, envelope["payload"])
    except UntrustedState as e:
        raise StateViewError(f"{path}: {e}") from None
    written = max(written, journal_written)
    try:
        allocations = _allocations(payload.get("ledger"))
        pods, containers = records_from_dict(payload.get("records"))
        hook = _hook_cgroups(payload.get(PROCESSES_KEY)) if PROCESSES_KEY in payload else None
        recorded = (RecordedConfig.from_dict(payload[CONFIG_KEY]) if CONFIG_KEY in payload
                    else None)
    except (AllocationsError, RecordError) as e:
        raise StateViewError(f"{path}: {e}") from None
    return Checkpoint(allocations, pods, containers, hook, str(envelope.get("machine")), written,
                      recorded)


def check_machine(checkpoint: Checkpoint, fingerprint: str, path: Path) -> None:
    if checkpoint.machine != fingerprint:
        raise StateViewError(f"{path} was written on another machine (or before its CPUs "
                             "changed): nri-numa sets it aside when it next starts")


def build_view(state_dir: Path, checkpoint: Checkpoint, cgroup_root: Path,
               reserved: frozenset[int] | None = None) -> StateView:
    """The containers of ``checkpoint`` with their cgroups read and compared. ``reserved``
    (from --config) wins over the reserved CPUs the checkpoint recorded."""
    if reserved is None and checkpoint.recorded is not None:
        reserved = checkpoint.recorded.reserved_cpus
    tree = find_cpuset_tree(cgroup_root)
    allocations, records = checkpoint.allocations, checkpoint.containers
    notes = []
    if tree is None:
        notes.append(f"no cpuset cgroup hierarchy under {cgroup_root}: cgroups not checked")
    if checkpoint.hook_cgroups is None:
        wanted = {cid: _pod_parent(checkpoint.pods, r) for cid, r in records.items()}
        located = locate_all(tree, wanted) if tree is not None else {}
    else:
        located = {cid: p for cid, p in checkpoint.hook_cgroups.items() if p is not None}
    read = readings(tree, located, records)
    if checkpoint.hook_cgroups is not None:
        read = {cid: CgroupReading(None, problem="pending: placed by precreate, not created yet")
                if cid in checkpoint.hook_cgroups and checkpoint.hook_cgroups[cid] is None
                else r for cid, r in read.items()}
    views = tuple(_container_view(r, checkpoint.pods.get(r.sandbox_id), allocations,
                                  read[cid]) for cid, r in records.items())
    return StateView(state_dir / FILE_NAME, "nri" if checkpoint.hook_cgroups is None else "hook",
                     checkpoint.written, allocations.shared, reserved, tree, views,
                     _node_memory(allocations.memory), tuple(notes), checkpoint.recorded)


def drift_of(record: ContainerRecord, expected: frozenset[int],
             cgroup: CgroupReading) -> tuple[str, ...]:
    """How the cgroup differs from the ledger, one phrase per file; () when it agrees or
    cannot be compared."""
    if cgroup.path is None or cgroup.problem:
        return ()
    found = []
    if cgroup.cpus != expected:
        found.append(f"cpuset.cpus is {_listed(cgroup.cpus)}, ledger says {_listed(expected)}")
    if record.mems is not None and cgroup.mems != record.mems:
        found.append(f"cpuset.mems is {_listed(cgroup.mems)}, ledger says "
                     f"{_listed(record.mems)}")
    return tuple(found)


def age(view: StateView, now: float | None = None) -> float:
    return max(0.0, (time.time() if now is None else now) - view.written)


# --- reading ---------------------------------------------------------------------------------


def _envelope(raw: bytes, path: Path, boot_id: str | None) -> dict[str, Any]:
    try:
        return read_envelope(raw, boot_id=boot_id)
    except UntrustedCheckpoint as e:
        raise StateViewError(f"{path}: {e}") from None


def _allocations(ledger: Any) -> Allocations:
    if not isinstance(ledger, dict) or ledger.get("version") != LEDGER_VERSION:
        version = ledger.get("version") if isinstance(ledger, dict) else None
        raise AllocationsError(f"ledger version is {version!r}; this nri-numa reads "
                               f"{LEDGER_VERSION}")
    return Allocations.from_dict(ledger.get("allocations"))


def _hook_cgroups(raw: Any) -> dict[str, str | None]:
    if not isinstance(raw, dict):
        raise RecordError(f"{PROCESSES_KEY} must be an object")
    cgroups: dict[str, str | None] = {}
    for cid, entry in raw.items():
        cgroup = entry.get("cgroup") if isinstance(entry, dict) else None
        if cgroup is not None and not isinstance(cgroup, str):
            raise RecordError(f"{PROCESSES_KEY}[{cid!r}].cgroup must be a string or null")
        cgroups[cid] = cgroup
    return cgroups


def _pod_parent(pods: Mapping[str, PodRecord], record: ContainerRecord) -> str:
    pod = pods.get(record.sandbox_id)
    return pod.cgroup_parent if pod is not None else ""


# --- the view of one container ---------------------------------------------------------------


def _container_view(record: ContainerRecord, pod: PodRecord | None, allocations: Allocations,
                    cgroup: CgroupReading) -> ContainerView:
    expected = record.cpus if record.exclusive else allocations.shared
    held = allocations.container(record.pod_uid, record.name)  # unplaced: its devices at most
    return ContainerView(
        id=record.id, pod=pod, name=record.name,
        qos=qos_from_cgroup_parent(pod.cgroup_parent) if pod is not None else None,
        exclusive=record.exclusive, in_ledger=record.in_ledger, cpus=expected, mems=record.mems,
        memory=_memory_held(allocations.memory, record) if record.in_ledger else (),
        devices=held.devices if held is not None else {},
        device_nodes=record.request.device_numa_hints,
        cgroup=cgroup, drift=drift_of(record, expected, cgroup))


def _memory_held(memory: MemoryState | None, record: ContainerRecord) -> tuple[MemoryHeld, ...]:
    if memory is None:
        return ()
    blocks = memory.container_blocks(record.pod_uid, record.name) or ()
    return tuple(MemoryHeld(b.type, tuple(b.numa_affinity), b.size) for b in blocks)


def _node_memory(memory: MemoryState | None) -> tuple[NodeMemory, ...]:
    if memory is None:
        return ()
    return tuple(NodeMemory(node, resource, table.allocatable, table.reserved)
                 for node, state in memory.nodes.items()
                 for resource, table in sorted(state.tables.items())
                 if table.allocatable or table.reserved)


def _listed(cpus: frozenset[int] | None) -> str:
    return "empty" if not cpus else format_list(cpus)
