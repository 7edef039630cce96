"""A fake host for the hook: a cgroup tree (v1 with a cpuset hierarchy, or v2 unified) and a
/proc with the container processes the tests pretend to run.

Like the kernel, a cgroup's effective files follow what is written to ``cpuset.cpus`` and
``cpuset.mems``: they are symlinks to them (the hook opens files it writes without following
symlinks, and reads effective files with it). A test that wants the kernel to narrow a write —
cgroup v2 does when the parent lacks the CPUs — replaces a symlink with a fixed file.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from nri_numa.hook.cgroup import CgroupFs
from nri_numa.topology.cpulist import format_list, parse_list
from nri_numa.topology.model import Topology


@dataclass
class FakeHost:
    base: Path
    version: int  # 1 or 2
    online: frozenset[int]

    def __post_init__(self) -> None:
        self.cgroup_root.mkdir(parents=True, exist_ok=True)
        self.proc.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            (self.cgroup_root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        self.make_cgroup("/", self.online, frozenset({0}))
        self.set_own_cgroup("/runtime.slice/engine")

    @property
    def cgroup_root(self) -> Path:
        return self.base / "cgroup"

    @property
    def proc(self) -> Path:
        return self.base / "proc"

    @property
    def hierarchy(self) -> Path:
        return self.cgroup_root / "cpuset" if self.version == 1 else self.cgroup_root

    @property
    def fs(self) -> CgroupFs:
        return CgroupFs(self.cgroup_root, self.proc)

    def dir(self, path: str) -> Path:
        return self.hierarchy / path.lstrip("/")

    def make_cgroup(self, path: str, cpus: frozenset[int] | None = None,
                    mems: frozenset[int] | None = None) -> Path:
        folder = self.dir(path)
        folder.mkdir(parents=True, exist_ok=True)
        effective = (("cpuset.effective_cpus", "cpuset.effective_mems") if self.version == 1
                     else ("cpuset.cpus.effective", "cpuset.mems.effective"))
        for name, link, value in (("cpuset.cpus", effective[0], cpus or self.online),
                                  ("cpuset.mems", effective[1], mems or frozenset({0}))):
            (folder / name).write_text(format_list(value) + "\n")
            if not (folder / link).is_symlink():
                (folder / link).symlink_to(name)
        return folder

    def start(self, pid: int, cgroup: str, start_time: int | None = None) -> None:
        """A container process in ``cgroup`` (made when missing)."""
        if not self.dir(cgroup).is_dir():
            self.make_cgroup(cgroup)
        self._write_proc(str(pid), cgroup)
        fields = ["S"] + ["0"] * 18 + [str(start_time or 100_000 + pid)] + ["0"] * 30
        (self.proc / str(pid) / "stat").write_text(f"{pid} (sleep) " + " ".join(fields) + "\n")

    def stop(self, pid: int, remove_cgroup: bool = True) -> None:
        cgroup = self.cgroup_of(pid)
        shutil.rmtree(self.proc / str(pid))
        if remove_cgroup and cgroup not in ("/", ""):
            shutil.rmtree(self.dir(cgroup))

    def set_own_cgroup(self, cgroup: str) -> None:
        self._write_proc("self", cgroup)

    def cgroup_of(self, pid: int) -> str:
        for line in (self.proc / str(pid) / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.version == 1 and controllers == "cpuset") or (
                    self.version == 2 and controllers == ""):
                return path
        raise AssertionError(f"no cpuset line for {pid}")

    def cpus(self, cgroup: str) -> frozenset[int]:
        return parse_list((self.dir(cgroup) / "cpuset.cpus").read_text())

    def mems(self, cgroup: str) -> frozenset[int]:
        return parse_list((self.dir(cgroup) / "cpuset.mems").read_text())

    def _write_proc(self, pid: str, cgroup: str) -> None:
        (self.proc / pid).mkdir(parents=True, exist_ok=True)
        if self.version == 1:  # a hybrid host: cpuset in v1, an empty unified tree beside it
            text = f"4:memory:{cgroup}\n3:cpuset:{cgroup}\n1:name=systemd:{cgroup}\n0::{cgroup}\n"
        else:
            text = f"0::{cgroup}\n"
        (self.proc / pid / "cgroup").write_text(text)


def oci_state(cid: str, pid: int | None, bundle: Path, **annotations: str) -> bytes:
    state = {"ociVersion": "1.0.2-dev", "id": cid, "status": "creating", "bundle": str(bundle),
             "annotations": annotations}
    if pid is not None:
        state["pid"] = pid
    return json.dumps(state).encode()


def write_bundle(base: Path, cid: str, cpus: int = 0, annotations: dict | None = None,
                 hooks: dict | None = None) -> Path:
    """A bundle folder with a config.json asking for ``cpus`` exclusive CPUs (0: none)."""
    bundle = base / "bundles" / cid
    bundle.mkdir(parents=True, exist_ok=True)
    resources = {}
    if cpus:
        resources = {"cpu": {"quota": cpus * 100_000, "period": 100_000},
                     "memory": {"limit": 64 << 20}}
    spec = {"ociVersion": "1.0.2", "process": {"args": ["sleep"], "env": ["PATH=/bin"]},
            "linux": {"cgroupsPath": f"/pods/{cid}", "resources": resources},
            "annotations": annotations or {}, "hooks": hooks or {}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def topology_file(base: Path, topology: Topology) -> Path:
    path = base / "topology.json"
    path.write_text(topology.to_json())
    os.chmod(path, 0o644)
    return path
