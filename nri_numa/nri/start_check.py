"""Cpusets that a starting container missed, found at PostStartContainer.

A cpuset update the plugin sends for a container that is being started can land in the stored
spec only: containerd applies an update to the container's cgroup only once it counts the
container as running, and between runc creating the cgroup (from the spec as it was then) and
the start completing, it does not. The container then runs on the CPUs it was created with,
exclusive CPUs of a newer container among them, while the runtime reports the new cpuset.

So at PostStartContainer, when the container's cgroup exists and is running, two checks: did
the cpuset change since the adjustment that created the container, and does the cgroup (where
the agent can read it) hold what the ledger says. Either one calls for the cpuset to be sent
again, now that it reaches the cgroup. After a restart only the second is possible, and
Synchronize makes it for every running container: the spec the runtime reports can be right
while the cgroup is not.

Later, anything that pushes a container's whole resource set (``runc update``, a systemd
daemon-reload, another agent) can undo its cpuset. Like the kubelet's reconcile loop, the agent
compares every placed container's cgroup with the ledger every ``cpuManagerReconcilePeriod``
(``drifted``) and sends the cpuset again where they differ; the cgroups paths it needs are
those the runtime named at CreateContainer, Synchronize and PostStartContainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nri_numa.runtime.cpuset_cgroups import (CpusetTree, cgroup_path_of, find_cpuset_tree,
                                             read_cgroup)
from nri_numa.topology.cpulist import format_cached

CpuSet = frozenset[int]


@dataclass(frozen=True, slots=True)
class Cpuset:
    cpus: CpuSet
    mems: CpuSet | None  # None: memory nodes left as the runtime set them


class StartCheck:
    """What each container was created with, until it has started; and the cgroups to read."""

    def __init__(self, cgroup_root: Path | None) -> None:
        self._root = cgroup_root
        self._tree: CpusetTree | None = None
        # Each cpuset as text: a shared container's is the pool of its creation, and a pool of a
        # big machine's thousands of CPUs held as a set for every such container was most of
        # the agent's memory at 2000 containers.
        self._created: dict[str, tuple[str, CpuSet | None]] = {}
        self._cgroups: dict[str, str] = {}  # container id → its OCI spec's cgroups path

    def created(self, container_id: str, cpuset: Cpuset) -> None:
        self._created[container_id] = _as_text(cpuset)

    def cgroup_of(self, container_id: str, cgroups_path: str) -> None:
        """Where the runtime put the container's cgroup, for the periodic check."""
        if cgroups_path:
            self._cgroups[container_id] = cgroups_path

    def forget(self, container_ids: list[str]) -> None:
        for container_id in container_ids:
            self._created.pop(container_id, None)
            self._cgroups.pop(container_id, None)

    def drifted(self, wanted: dict[str, Cpuset]) -> list[str]:
        """The containers of ``wanted`` (id → the cpuset the ledger gives it) whose cgroup
        holds another cpuset; those still starting, or whose cgroup cannot be read, are not."""
        return [cid for cid, cpuset in wanted.items()
                if cid not in self._created and cid in self._cgroups
                and self.cgroup_differs(self._cgroups[cid], cpuset)]

    def missed(self, container_id: str, cgroups_path: str, wanted: Cpuset) -> str | None:
        """Why ``wanted`` must be sent again to this started container; None when it holds."""
        created = self._created.pop(container_id, None)
        if created is not None and created != _as_text(wanted):
            return "changed while it started"
        return "its cgroup differed after it started" if self.cgroup_differs(cgroups_path, wanted) else None

    def cgroup_differs(self, cgroups_path: str, wanted: Cpuset) -> bool:
        """Whether the container's cgroup, where it can be read, holds another cpuset."""
        cgroup = self._cgroup_cpuset(cgroups_path)
        if cgroup is None:
            return False
        return cgroup.cpus != wanted.cpus or (wanted.mems is not None
                                              and cgroup.mems != wanted.mems)

    def _cgroup_cpuset(self, cgroups_path: str) -> Cpuset | None:
        path = cgroup_path_of(cgroups_path)
        if path is None or self._root is None:
            return None
        if self._tree is None:
            self._tree = find_cpuset_tree(self._root)
            if self._tree is None:
                self._root = None  # no cpuset hierarchy here: never looked for again
                return None
        reading = read_cgroup(self._tree, path)
        if reading.cpus is None:
            return None
        return Cpuset(reading.cpus, reading.mems)


def _as_text(cpuset: Cpuset) -> tuple[str, CpuSet | None]:
    return format_cached(cpuset.cpus), cpuset.mems
