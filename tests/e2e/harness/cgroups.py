"""What a container really got: its cgroup's cpuset files read from the host (cgroup v1 with the
cpuset hierarchy at /sys/fs/cgroup/cpuset, or the v2 unified tree), and the kernel's own view
from inside the container (/proc/self/status)."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nri_numa.topology.cpulist import parse_list
from tests.e2e.harness.cri import CriClient

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupLayout:
    version: int  # 1 or 2
    mount: Path  # /sys/fs/cgroup (v2) or the cpuset hierarchy's mount (v1)

    @property
    def hierarchies(self) -> list[Path]:
        """Every tree a cgroupfs-driven runc makes the container's directories in."""
        if self.version == 2:
            return [self.mount]
        return sorted(p for p in self.mount.parent.iterdir() if p.is_dir() and not p.is_symlink())


@dataclass(frozen=True)
class Cpuset:
    cpus: str
    mems: str
    effective_cpus: str
    effective_mems: str

    @property
    def cpu_ids(self) -> frozenset[int]:
        return parse_list(self.cpus)

    @property
    def effective_cpu_ids(self) -> frozenset[int]:
        return parse_list(self.effective_cpus)


@dataclass(frozen=True)
class AllowedLists:
    """Cpus_allowed_list and Mems_allowed_list of a process, as /proc/<pid>/status says."""

    cpus: str
    mems: str

    @property
    def cpu_ids(self) -> frozenset[int]:
        return parse_list(self.cpus)


def detect_layout(root: Path = CGROUP_ROOT) -> CgroupLayout:
    controllers = root / "cgroup.controllers"
    if controllers.is_file():
        if "cpuset" not in controllers.read_text().split():
            raise RuntimeError(f"cgroup v2 at {root} does not offer the cpuset controller")
        return CgroupLayout(2, root)
    if (root / "cpuset" / "cpuset.cpus").is_file():
        return CgroupLayout(1, root / "cpuset")
    raise RuntimeError(f"no cpuset cgroup controller under {root} (neither v2 nor a v1 cpuset hierarchy)")


def _read(path: Path) -> str:
    return path.read_text().strip()


def read_cpuset(layout: CgroupLayout, cgroup_path: str) -> Cpuset:
    folder = layout.mount / cgroup_path.lstrip("/")
    if not folder.is_dir():
        raise FileNotFoundError(f"cgroup {cgroup_path} does not exist under {layout.mount}")
    if layout.version == 1:
        names = ("cpuset.cpus", "cpuset.mems", "cpuset.effective_cpus", "cpuset.effective_mems")
    else:
        names = ("cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective", "cpuset.mems.effective")
    return Cpuset(*(_read(folder / name) for name in names))


def container_cgroup_path(info: dict[str, object]) -> str:
    """linux.cgroupsPath of the OCI spec containerd wrote (CriClient.container_info)."""
    spec = info.get("runtimeSpec")
    path = spec.get("linux", {}).get("cgroupsPath", "") if isinstance(spec, dict) else ""
    if not path or not path.startswith("/"):
        # "slice:prefix:name" would mean the systemd driver; the harness configures cgroupfs.
        raise RuntimeError(f"container has no cgroupfs-style cgroupsPath (got {path!r})")
    return path


def process_cgroup(pid: int, layout: CgroupLayout) -> str:
    """The cgroup of a process in the cpuset hierarchy (v1) or the unified one (v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (layout.version == 2 and controllers == "") or "cpuset" in controllers.split(","):
            return path
    raise RuntimeError(f"/proc/{pid}/cgroup names no {'unified' if layout.version == 2 else 'cpuset'} cgroup")


def parse_status_allowed(status_text: str) -> AllowedLists:
    fields = dict(line.split(":", 1) for line in status_text.splitlines() if ":" in line)
    try:
        return AllowedLists(fields["Cpus_allowed_list"].strip(), fields["Mems_allowed_list"].strip())
    except KeyError as missing:
        raise RuntimeError(f"/proc/self/status lacks {missing}") from None


def allowed_inside(client: CriClient, container_id: str) -> AllowedLists:
    """`cat /proc/self/status` run inside the container through CRI ExecSync."""
    result = client.exec_sync(container_id, ["cat", "/proc/self/status"])
    if result.exit_code != 0:
        raise RuntimeError(f"exec in {container_id} failed ({result.exit_code}): {result.stderr.strip()}")
    return parse_status_allowed(result.stdout)


def remove_cgroups(layout: CgroupLayout, cgroup_paths: Iterable[str]) -> list[str]:
    """rmdir the given cgroups (and empty children) in every hierarchy: runc removes a container's
    cgroup but never the pod's parent, which the kubelet would own. Returns what stayed busy."""
    busy = []
    for hierarchy in layout.hierarchies:
        for cgroup_path in cgroup_paths:
            top = hierarchy / cgroup_path.lstrip("/")
            if not top.is_dir():
                continue
            for folder, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
                problem = _rmdir(folder)
                if problem:
                    busy.append(f"{folder}: {problem}")
    return busy


def _rmdir(folder: str, patience_s: float = 2.0) -> str | None:
    """rmdir, waiting a little while the kernel still counts a process that was just killed
    (EBUSY); the error's text when it stays."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            os.rmdir(folder)
            return None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return exc.strerror
        time.sleep(0.05)
