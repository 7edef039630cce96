"""What the hook daemon keeps between runs: the ledger as it last saved it, and where each placed
container's cgroup is.

A hook process must read the checkpoint and find every cgroup it writes; the daemon, serving
run after run, need not. It keeps the ledger it saved, together with the checkpoint file's
identity (inode, size, times) right after that save, and uses it again only while the file is
still that one: a hook that ran in process meanwhile, a person who removed the file, or a
checkpoint set aside all show as another identity, and the run then loads the file as a hook
process would. A kept ledger is handed out once: a run that fails before saving leaves nothing
behind, so the next run reads the file.

The checkpoint's members are kept encoded as the NRI plugin keeps them (PayloadEncoders).

Cgroups are kept by process (pid and start time: a reused pid is another key) and dropped once
their container is no longer placed; a cgroup that can no longer be written is looked up again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nri_numa.hook.cgroup import CgroupFs, ContainerCgroup
from nri_numa.hook.procs import ProcessId
from nri_numa.state.encoding import LedgerEncoder, RecordsEncoder

if TYPE_CHECKING:
    from nri_numa.engine.context import EngineContext
    from nri_numa.hook.shared_ledger import SharedLedger


@dataclass(frozen=True, slots=True)
class FileIdentity:
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """The file at ``path`` as the kernel tells one version from another; None when missing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return FileIdentity(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeptLedger:
    """The ledger of the last successful save, while the checkpoint is still that file."""

    def __init__(self) -> None:
        self._book: SharedLedger | None = None
        self._path: str | None = None
        self._identity: FileIdentity | None = None
        self.loads = 0  # runs that read the file: a test's window into the cache

    def take(self, path: str | os.PathLike[str], ctx: EngineContext) -> SharedLedger | None:
        """The kept ledger, or None when the run must load the file (nothing kept, another
        machine or configuration loaded since, or the file changed)."""
        book, self._book = self._book, None
        if book is None or book.ctx is not ctx or self._path != os.fspath(path) \
                or file_identity(path) != self._identity:
            self.loads += 1
            return None
        return book

    def keep(self, path: str | os.PathLike[str], book: SharedLedger) -> None:
        """Called under the state lock, right after ``book`` was saved to ``path``."""
        self._identity = file_identity(path)
        self._path = os.fspath(path)
        self._book = book if self._identity is not None else None


class CgroupPaths:
    """Each placed container's cgroup, as ``cgroup.locate`` found and checked it."""

    def __init__(self) -> None:
        self._fs: CgroupFs | None = None
        self._paths: dict[ProcessId, ContainerCgroup] = {}

    def get(self, fs: CgroupFs, process: ProcessId) -> ContainerCgroup | None:
        return self._on(fs).get(process)

    def put(self, fs: CgroupFs, process: ProcessId, cgroup: ContainerCgroup) -> None:
        self._on(fs)[process] = cgroup

    def _on(self, fs: CgroupFs) -> dict[ProcessId, ContainerCgroup]:
        """The cgroups found under ``fs``: another cgroup root or /proc forgets them all."""
        if fs != self._fs:
            self._fs, self._paths = fs, {}
        return self._paths

    def forget(self, process: ProcessId) -> None:
        self._paths.pop(process, None)

    def keep_only(self, placed: set[ProcessId]) -> None:
        """Drop the cgroups of containers no longer placed."""
        for process in [p for p in self._paths if p not in placed]:
            del self._paths[process]

    def __len__(self) -> int:
        return len(self._paths)


@dataclass(frozen=True, slots=True)
class PayloadEncoders:
    """The ledger and the records as canonical JSON, each member kept encoded until it changes
    (nri_numa.state.encoding, as the NRI plugin saves): a run changes one container's entries
    and the pool, not the other forty."""

    ledger: LedgerEncoder = field(default_factory=LedgerEncoder)
    records: RecordsEncoder = field(default_factory=RecordsEncoder)


class DaemonCache:
    """Everything the daemon keeps from one run to the next."""

    def __init__(self) -> None:
        self.ledger = KeptLedger()
        self.cgroups = CgroupPaths()
        self.encoders = PayloadEncoders()
