"""The kubelet's CPU and Memory Manager checkpoints, read and checked: ``cpu_manager_state`` and
``memory_manager_state`` in the kubelet's root directory (docs/migrating-from-kubelet.md has
the format, with the versions it was taken from).

Both are one JSON object with a ``checksum``: FNV-1a (32 bits) of the checkpoint as the Go
library go-spew prints it with ``%#v`` (types shown, map keys sorted, no pointer addresses),
with the checksum field set to 0. A checksum of 0 is accepted, as the kubelet accepts it (files
of its older file backend). The printing is rebuilt here from the structs' field order and Go
type names, which are part of the format: a file whose checksum does not match is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.safeio.bounds import clip
from nri_numa.safeio.documents import DocumentError, load_json
from nri_numa.topology.cpulist import ListFormatError, parse_list

CPU_STATE_FILE = "cpu_manager_state"
MEMORY_STATE_FILE = "memory_manager_state"
MAX_FILE_BYTES = 16 << 20  # a 5000-container node's file is under 1 MiB


class KubeletCheckpointError(ValueError):
    """One line naming the file and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class KubeletCpuState:
    policy: str
    default_cpus: frozenset[int]
    # (pod uid, container name) → its CPUs; the v1 format keys by container id: ("", id).
    assignments: dict[tuple[str, str], frozenset[int]]
    format: str  # "v2" (pod uid → container name → CPUs, kubelet 1.14 and later) or "v1"


@dataclass(frozen=True, slots=True)
class MemoryBlock:
    numa_nodes: frozenset[int]
    resource: str  # "memory", "hugepages-2Mi", ...
    size: int  # bytes


@dataclass(frozen=True, slots=True)
class KubeletMemoryState:
    policy: str
    assignments: dict[tuple[str, str], tuple[MemoryBlock, ...]]  # (pod uid, container) → blocks


@dataclass(frozen=True, slots=True)
class KubeletPlacements:
    """What the kubelet's two checkpoints give the running containers; either may be missing."""

    cpu: KubeletCpuState | None = None
    memory: KubeletMemoryState | None = None

    def cpus_of(self, pod_uid: str, name: str, container_id: str) -> frozenset[int] | None:
        """By pod UID and container name (v2 layout), or by container id (v1)."""
        if self.cpu is None:
            return None
        return (self.cpu.assignments.get((pod_uid, name))
                or self.cpu.assignments.get(("", container_id)))

    def memory_of(self, pod_uid: str, name: str) -> tuple[MemoryBlock, ...] | None:
        if self.memory is None:
            return None
        return self.memory.assignments.get((pod_uid, name))


def fnv1a_32(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


# --- go-spew's %#v, for the shapes these two files have ------------------------------------


def _spew_map(items: dict[Any, Any], value: Callable[[Any], str], numeric_keys: bool = False) -> str:
    keys = sorted(items, key=int) if numeric_keys else sorted(items)
    return "map[" + " ".join(f"{k}:{value(items[k])}" for k in keys) + "]"


def cpu_checkpoint_text(policy: str, default_cpus: str, entries: dict[str, Any],
                        v2: bool = True) -> str:
    """The kubelet's printing of a CPU Manager checkpoint: v2 (pod → container → CPUs) or v1
    (container id → CPUs; the kubelet prints it under the v2 struct's name)."""
    if v2:
        entries_type = "map[string]map[string]string"
        shown = _spew_map(entries, lambda inner: _spew_map(inner, str))
    else:
        entries_type = "map[string]string"
        shown = _spew_map(entries, str)
    return (f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
            f"DefaultCPUSet:(string){default_cpus} Entries:({entries_type}){shown} "
            f"Checksum:(checksum.Checksum)0}}")


def _spew_table(table: dict[str, Any]) -> str:
    return ("<*>{" + " ".join(f"{name}:(uint64){table.get(key, 0)}" for name, key in (
        ("TotalMemSize", "total"), ("SystemReserved", "systemReserved"),
        ("Allocatable", "allocatable"), ("Reserved", "reserved"), ("Free", "free"))) + "}")


def _spew_node(node: dict[str, Any] | None) -> str:
    if node is None:
        return "<nil>"
    memory = node.get("memoryMap")
    cells = node.get("cells")
    return ("<*>{NumberOfAssignments:(int)" + str(node.get("numberOfAssignments", 0)) +
            " MemoryMap:(map[v1.ResourceName]*state.MemoryTable)" +
            ("<nil>" if memory is None else _spew_map(memory, _spew_table)) +
            " Cells:([]int)" + ("<nil>" if cells is None else _spew_ints(cells)) + "}")


def _spew_ints(values: list[int]) -> str:
    return "[" + " ".join(str(v) for v in values) + "]"


def _spew_blocks(blocks: list[dict[str, Any]]) -> str:
    return "[" + " ".join(
        "{NUMAAffinity:([]int)" + _spew_ints(b.get("numaAffinity") or []) +
        f" Type:(v1.ResourceName){b.get('type', '')} Size:(uint64){b.get('size', 0)}}}"
        for b in blocks) + "]"


def memory_checkpoint_text(policy: str, machine: dict[str, Any], entries: dict[str, Any]) -> str:
    """The kubelet's printing of a Memory Manager checkpoint."""
    return ("(*state.MemoryManagerCheckpoint){PolicyName:(string)" + policy +
            " MachineState:(state.NUMANodeMap)" + _spew_map(machine, _spew_node, numeric_keys=True) +
            " Entries:(state.ContainerMemoryAssignments)" +
            _spew_map(entries, lambda inner: _spew_map(inner, _spew_blocks)) +
            " Checksum:(checksum.Checksum)0}")


# --- reading -----------------------------------------------------------------------------------


def read_cpu_state(path: Path) -> KubeletCpuState:
    doc = _document(path)
    policy = _text(doc, "policyName", path)
    default = _text(doc, "defaultCpuSet", path)
    entries = doc.get("entries") or {}
    if not isinstance(entries, dict):
        raise KubeletCheckpointError(f"{path}: entries is not a map")
    v2 = all(isinstance(v, dict) for v in entries.values())
    flat = all(isinstance(v, str) for v in entries.values())
    if not v2 and not flat:
        raise KubeletCheckpointError(f"{path}: entries are neither the v1 nor the v2 format")
    if v2 and flat:  # no entries: either format; the checksum tells which printed it
        v2 = _sum_matches(doc, cpu_checkpoint_text(policy, default, entries, v2=True))
    _check_sum(path, doc, cpu_checkpoint_text(policy, default, entries, v2=v2))
    assignments: dict[tuple[str, str], frozenset[int]] = {}
    for outer, value in entries.items():
        inner = value if v2 else {outer: value}
        for name, cpus in inner.items():
            key = (outer, name) if v2 else ("", outer)
            assignments[key] = _cpus(cpus, f"entries.{clip(outer)}", path)
    return KubeletCpuState(policy, _cpus(default, "defaultCpuSet", path), assignments,
                           "v2" if v2 else "v1")


def read_memory_state(path: Path) -> KubeletMemoryState:
    doc = _document(path)
    policy = _text(doc, "policyName", path)
    machine = {} if doc.get("machineState") is None else doc["machineState"]
    entries = doc.get("entries") or {}
    if not isinstance(machine, dict) or not isinstance(entries, dict) or not all(
            isinstance(v, dict) and all(isinstance(b, list) for b in v.values())
            for v in entries.values()):
        raise KubeletCheckpointError(f"{path}: machineState or entries is not as the kubelet "
                                     f"writes them")
    try:
        text = memory_checkpoint_text(policy, machine, entries)
        assignments = {(pod, name): tuple(_block(b) for b in blocks)
                       for pod, containers in entries.items()
                       for name, blocks in containers.items()}
    except (TypeError, ValueError, AttributeError) as e:
        raise KubeletCheckpointError(f"{path}: not a Memory Manager checkpoint: "
                                     f"{clip(str(e))}") from None
    _check_sum(path, doc, text)
    return KubeletMemoryState(policy, assignments)


def _block(raw: dict[str, Any]) -> MemoryBlock:
    nodes, kind, size = raw.get("numaAffinity") or [], raw.get("type"), raw.get("size")
    if (not isinstance(kind, str) or not isinstance(size, int) or size < 0
            or not all(isinstance(n, int) and n >= 0 for n in nodes)):
        raise ValueError(f"block {clip(str(raw))}")
    return MemoryBlock(frozenset(nodes), kind, size)


def _document(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise KubeletCheckpointError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise KubeletCheckpointError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        doc = load_json(raw, str(path))
    except DocumentError as e:
        raise KubeletCheckpointError(str(e)) from None
    if not isinstance(doc, dict):
        raise KubeletCheckpointError(f"{path}: not a JSON object")
    if "data" in doc or "dataChecksum" in doc:
        raise KubeletCheckpointError(f"{path}: the newer format with a data section is not "
                                     f"read yet")
    return doc


def _text(doc: dict[str, Any], key: str, path: Path) -> str:
    # Go's JSON decoder matches keys without regard to case: "defaultCPUSet" is read too.
    value = next((v for k, v in doc.items() if k.lower() == key.lower()), "")
    if not isinstance(value, str):
        raise KubeletCheckpointError(f"{path}: {key} is not a string")
    return value


def _cpus(text: Any, where: str, path: Path) -> frozenset[int]:
    if not isinstance(text, str):
        raise KubeletCheckpointError(f"{path}: {where} is not a CPU list")
    try:
        return parse_list(text)
    except ListFormatError as e:
        raise KubeletCheckpointError(f"{path}: {where}: {e}") from None


def _sum_matches(doc: dict[str, Any], text: str) -> bool:
    stored = doc.get("checksum", 0)
    return stored == 0 or stored == fnv1a_32(text.encode())


def _check_sum(path: Path, doc: dict[str, Any], text: str) -> None:
    stored = doc.get("checksum", 0)
    if not isinstance(stored, int) or isinstance(stored, bool):
        raise KubeletCheckpointError(f"{path}: checksum is not a number")
    if stored == 0:
        return  # the kubelet accepts it too: files of its older file backend
    computed = fnv1a_32(text.encode())
    if computed != stored:
        raise KubeletCheckpointError(f"{path}: checksum {stored} does not match its content "
                                     f"({computed}): the file is damaged or not the kubelet's")
