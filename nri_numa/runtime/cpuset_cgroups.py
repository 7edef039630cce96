"""Where a placed container's cpuset cgroup is, and what its cpuset files say: read only.

``nri-numa state`` compares these files with the ledger. The NRI plugin never learns a
container's cgroup (the runtime applies the cpuset), so it is looked for by name: the pod's
cgroup parent, which the checkpoint keeps, plus the container's own folder as each runtime
names it (cgroupfs: ``<parent>/<id>`` for containerd, ``<parent>/crio-<id>`` for CRI-O; systemd:
``<slices>/cri-containerd-<id>.scope`` or ``crio-<id>.scope``). Where that misses (a runtime or
layout not foreseen), one bounded walk of the hierarchy looks for the same names. The OCI hook
records the cgroup it wrote, so its containers need no search.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nri_numa.topology.cpulist import ListFormatError, parse_list

# Deep enough for /kubepods.slice/kubepods-burstable.slice/<pod>.slice/<container>.scope under a
# nested root (kind, a container running the node); bounded so a huge tree stays cheap.
WALK_DEPTH = 8


@dataclass(frozen=True, slots=True)
class CpusetTree:
    """The hierarchy that holds cpuset: cgroup v1's ``<root>/cpuset`` or v2's ``<root>``."""

    version: int
    mount: Path


@dataclass(frozen=True, slots=True)
class CgroupReading:
    """A container's cgroup as found: its path under the hierarchy and its cpuset, or why not.

    ``path`` None: no cgroup found (the container may not have started yet, or has exited).
    ``problem``: found but unreadable, or the hook's container not created yet."""

    path: str | None
    cpus: frozenset[int] | None = None
    mems: frozenset[int] | None = None
    problem: str = ""


def find_cpuset_tree(root: Path) -> CpusetTree | None:
    """cgroup v2 when ``root`` is a unified mount, else v1's cpuset hierarchy; None when neither."""
    if (root / "cgroup.controllers").is_file():
        return CpusetTree(2, root)
    if (root / "cpuset" / "cpuset.cpus").is_file():
        return CpusetTree(1, root / "cpuset")
    return None


def container_dir_names(container_id: str) -> tuple[str, ...]:
    """The folder names runtimes give a container's cgroup."""
    return (container_id, f"cri-containerd-{container_id}.scope", f"crio-{container_id}.scope",
            f"crio-{container_id}", f"docker-{container_id}.scope", f"libpod-{container_id}",
            f"libpod-{container_id}.scope")


def systemd_slice_path(unit: str) -> str:
    """``kubepods-besteffort-pod1.slice`` → ``/kubepods.slice/kubepods-besteffort.slice/
    kubepods-besteffort-pod1.slice``: systemd nests a slice in the slices its dashes name."""
    stem = unit.removesuffix(".slice")
    parts = stem.split("-")
    return "".join("/" + "-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


def cgroup_path_of(cgroups_path: str) -> str | None:
    """A container's cgroup in the hierarchy, from the cgroups path of its OCI spec: a path
    (cgroupfs driver) or ``<slice>:<prefix>:<name>`` (systemd driver, which runc makes
    ``<slice path>/<prefix>-<name>.scope``). None when empty or neither."""
    if cgroups_path.startswith("/"):
        return cgroups_path
    parts = cgroups_path.split(":")
    if len(parts) != 3 or not all(parts) or not parts[0].endswith(".slice"):
        return None
    unit, prefix, name = parts
    return f"{systemd_slice_path(unit)}/{prefix}-{name}.scope"


def parent_paths(cgroup_parent: str) -> tuple[str, ...]:
    """Where a pod's containers' cgroups sit, from the parent the runtime was given."""
    parent = cgroup_parent.strip()
    if not parent:
        return ()
    last = parent.rstrip("/").rsplit("/", 1)[-1]
    if last.endswith(".slice"):
        return (systemd_slice_path(last),)
    return ("/" + parent.strip("/"),)


def locate_all(tree: CpusetTree, wanted: Mapping[str, str]) -> dict[str, str]:
    """Container id → cgroup path (as /proc/PID/cgroup would name it) for the containers of
    ``wanted`` (id → its pod's cgroup parent) whose cgroup exists; the rest are missing."""
    found: dict[str, str] = {}
    for cid, parent in wanted.items():
        for base in parent_paths(parent):
            for name in container_dir_names(cid):
                path = f"{base.rstrip('/')}/{name}"
                if _is_cgroup(tree, path):
                    found[cid] = path
                    break
            if cid in found:
                break
    missing = {name: cid for cid in wanted if cid not in found
               for name in container_dir_names(cid)}
    if missing:
        found.update(_walk_for(tree, missing))
    return found


def read_cgroup(tree: CpusetTree, path: str) -> CgroupReading:
    """The cpuset a cgroup holds. cgroup v2 leaves ``cpuset.cpus`` empty until someone writes
    it, and then the parent's CPUs apply: the effective file says which."""
    folder = tree.mount / path.lstrip("/")
    if not folder.is_dir():
        return CgroupReading(None)
    try:
        cpus = _read_list(folder, "cpuset.cpus", "cpuset.cpus.effective", tree.version)
        mems = _read_list(folder, "cpuset.mems", "cpuset.mems.effective", tree.version)
    except (OSError, ListFormatError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return CgroupReading(path, problem=f"unreadable: {why}")
    return CgroupReading(path, cpus, mems)


def _read_list(folder: Path, name: str, effective: str, version: int) -> frozenset[int]:
    text = (folder / name).read_text().strip()
    if not text and version == 2:
        text = (folder / effective).read_text().strip()
    return parse_list(text)


def _is_cgroup(tree: CpusetTree, path: str) -> bool:
    folder = tree.mount / path.lstrip("/")
    return folder.is_dir() and not folder.is_symlink() and (folder / "cpuset.cpus").exists()


def _walk_for(tree: CpusetTree, names: Mapping[str, str]) -> dict[str, str]:
    """One walk of the hierarchy, symlinks not followed, at most WALK_DEPTH folders deep."""
    found: dict[str, str] = {}
    top = str(tree.mount)
    for folder, subfolders, _ in os.walk(top, followlinks=False, onerror=lambda e: None):
        rel = folder[len(top):]
        depth = rel.count("/")
        for sub in list(subfolders):
            cid = names.get(sub)
            if cid is not None and cid not in found and _is_cgroup(tree, f"{rel}/{sub}"):
                found[cid] = f"{rel}/{sub}"
        if depth >= WALK_DEPTH or len(found) == len(set(names.values())):
            subfolders.clear()
    return found


def readings(tree: CpusetTree | None, located: Mapping[str, str],
             ids: Iterable[str]) -> dict[str, CgroupReading]:
    """A reading for each id: its cpuset, or path None where no cgroup was found."""
    if tree is None:
        return {cid: CgroupReading(None, problem="no cpuset hierarchy") for cid in ids}
    return {cid: read_cgroup(tree, located[cid]) if cid in located else CgroupReading(None)
            for cid in ids}
