"""A container's cpuset cgroup, found through its process and written safely.

The cgroup comes from ``/proc/PID/cgroup`` of the container's init, never from the spec's
``cgroupsPath``: that one rule covers cgroupfs paths, podman's ``/libpod_parent/libpod-<id>`` and
the systemd driver's ``<slice>/<prefix>-<name>.scope`` (docs/oci-hook.md, "What each runtime
hands a hook"). cgroup v1 gives a ``N:cpuset:/path`` line (the hierarchy is mounted at
``<root>/<controllers>``); pure v2 gives ``0::/path`` under ``<root>``. In a hybrid layout
cpuset is in v1, so the v1 line wins.

Safety: the path must be absolute and plain (no ``.``/``..``, NUL or newline), not the root
cgroup, not the hook's own cgroup or one of its ancestors (that is the runtime's, not the
container's), and once resolved it must still lie inside the hierarchy. Files are opened
without following symlinks and never created. After writing, the values are read back, the
effective ones included: cgroup v2 accepts CPUs the parent lacks and only narrows the
effective set, so a write that "worked" can still leave the container elsewhere.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from nri_numa.topology.cpulist import ListFormatError, format_list, parse_list

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_PROC = Path("/proc")
_CONTROLLERS = re.compile(r"[a-z0-9_,=]+")  # a v1 hierarchy's folder name: "cpuset", "cpu,cpuacct"
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_MAX_LIST_BYTES = 1 << 16  # "0-8191" fits many times over; a list is read in one go


class CgroupError(Exception):
    """A cgroup that cannot be found, is unsafe to touch, or did not take a value."""


class ProcessGone(CgroupError):
    """The process whose cgroup was asked for has exited."""


@dataclass(frozen=True, slots=True)
class CgroupFs:
    """Where the cgroup hierarchies and /proc are: the host's, or fake trees in tests."""

    root: Path = DEFAULT_CGROUP_ROOT
    proc: Path = DEFAULT_PROC


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    version: int  # 1 or 2
    hierarchy: Path  # the mount holding cpuset: <root>/cpuset (v1) or <root> (v2)
    path: str  # as /proc/PID/cgroup names it: "/libpod_parent/libpod-<id>"

    @property
    def dir(self) -> Path:
        return self.hierarchy / self.path.lstrip("/")

    @property
    def effective_names(self) -> tuple[str, str]:
        """(effective CPUs, effective memory nodes) file names in this cgroup version."""
        if self.version == 1:
            return "cpuset.effective_cpus", "cpuset.effective_mems"
        return "cpuset.cpus.effective", "cpuset.mems.effective"


def locate(fs: CgroupFs, pid: int) -> ContainerCgroup:
    """The cpuset cgroup of process ``pid``, checked as the module says."""
    if pid <= 1:
        raise CgroupError(f"pid {pid} is not a container's process")
    lines = _cgroup_lines(fs, str(pid))
    found = _cpuset_entry(fs, lines)
    if found is None:
        raise CgroupError(f"process {pid} is in no cpuset cgroup (/proc/{pid}/cgroup has no "
                          "cpuset line, and there is no cgroup v2 tree with cpuset)")
    version, hierarchy, raw = found
    path = checked_path(raw)
    own = _own_entry(fs)
    if own is not None and own[1] == hierarchy:
        own_path = own[2].rstrip("/") or "/"
        if own_path == path or own_path.startswith(path + "/"):
            raise CgroupError(f"cgroup {path} of process {pid} is the hook's own cgroup or one "
                              "of its ancestors, not a container's: refusing to touch it")
    cgroup = ContainerCgroup(version, hierarchy, path)
    _check_inside(cgroup)
    return cgroup


def checked_path(raw: str) -> str:
    """A cgroup path safe to join under a hierarchy; CgroupError otherwise."""
    if not raw.startswith("/") or "\x00" in raw or "\n" in raw:
        raise CgroupError(f"cgroup path {raw!r} is not an absolute path")
    parts = [p for p in raw.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise CgroupError(f"cgroup path {raw!r} has a '.' or '..' component: refusing it")
    if not parts:
        raise CgroupError("the process is in the root cgroup: that is not a container's own "
                          "cgroup, refusing to change it")
    return "/" + "/".join(parts)


def write_cpuset(cgroup: ContainerCgroup, cpus: frozenset[int],
                 mems: frozenset[int] | None) -> int:
    """Give the cgroup ``cpuset.mems`` (unless None) then ``cpuset.cpus``, read both back with
    their effective values, and raise CgroupError unless they are exactly what was asked. A file
    that already holds its value (a stage run twice, memory nodes that stay, a pool a container
    was given already) is not written: each write makes the kernel walk the cgroup's tasks.
    Returns how many files were written. The cgroup was checked when ``locate`` found it."""
    if not cpus:
        raise CgroupError(f"refusing to give cgroup {cgroup.path} an empty CPU set")
    folder = f"{cgroup.hierarchy}/{cgroup.path.lstrip('/')}"  # cgroup.dir, without pathlib
    effective_cpus, effective_mems = cgroup.effective_names
    wanted = []
    written = 0
    if mems is not None:
        written += _write_changed(cgroup, folder, "cpuset.mems", mems)
        wanted.append(("effective memory nodes", mems, effective_mems))
    written += _write_changed(cgroup, folder, "cpuset.cpus", cpus)
    wanted.append(("effective CPUs", cpus, effective_cpus))
    for what, asked, name in wanted:
        _check(cgroup, what, asked, _read_list(f"{folder}/{name}", follow=True, expect=asked))
    return written


def _write_changed(cgroup: ContainerCgroup, folder: str, name: str,
                   value: frozenset[int]) -> int:
    """Write ``value`` to ``folder/name`` unless the file reads as the kernel writes that value
    (ranges, as ``format_list``), and read it back after a write. The number of writes (0 or 1).
    Compared as text, not parsed: a file that holds the value written another way is written
    again, which changes nothing."""
    path = f"{folder}/{name}"
    text = _formatted(value)
    if _read_raw(path).strip() == text.encode():
        return 0
    _write(path, text)
    _check(cgroup, name, value, _read_list(path, expect=value))
    return 1


def _check(cgroup: ContainerCgroup, what: str, asked: frozenset[int],
           have: frozenset[int]) -> None:
    if asked != have:
        raise CgroupError(f"cgroup {cgroup.path}: wrote {format_list(asked) or 'nothing'} but "
                          f"its {what} are {format_list(have) or 'empty'} (does the parent "
                          "cgroup's cpuset hold them?)")


def _cgroup_lines(fs: CgroupFs, pid: str) -> list[tuple[str, str]]:
    """(controllers, path) per line of /proc/PID/cgroup."""
    path = fs.proc / pid / "cgroup"
    try:
        text = _read_all(str(path)).decode()
    except FileNotFoundError:
        if pid == "self":
            return []
        raise ProcessGone(f"process {pid} is gone ({path} does not exist)") from None
    except OSError as e:
        raise CgroupError(f"cannot read {path}: {e.strerror}") from None
    lines = []
    for line in text.splitlines():
        _, sep, rest = line.partition(":")
        controllers, sep2, cgroup_path = rest.partition(":")
        if sep and sep2:
            lines.append((controllers, cgroup_path))
    return lines


@lru_cache(maxsize=4)
def _own_entry(fs: CgroupFs) -> tuple[int, Path, str] | None:
    """The hook's own cpuset cgroup: read once, it does not change while the hook runs."""
    return _cpuset_entry(fs, _cgroup_lines(fs, "self"))


def _cpuset_entry(fs: CgroupFs, lines: list[tuple[str, str]]) -> tuple[int, Path, str] | None:
    for controllers, path in lines:
        if "cpuset" in controllers.split(","):
            if not _CONTROLLERS.fullmatch(controllers):
                raise CgroupError(f"odd cgroup v1 controller list {controllers!r}")
            return 1, fs.root / controllers, path
    if (fs.root / "cgroup.controllers").is_file():
        for controllers, path in lines:
            if controllers == "":
                return 2, fs.root, path
    return None


def _check_inside(cgroup: ContainerCgroup) -> None:
    """The cgroup folder exists and, symlinks resolved, is below its hierarchy's mount."""
    top = _resolved_mount(str(cgroup.hierarchy))
    folder = f"{cgroup.hierarchy}/{cgroup.path.lstrip('/')}"  # cgroup.dir, without pathlib
    resolved = _resolved_folder(folder)
    real = os.path.realpath(folder) if resolved is None else resolved
    if not real.startswith(top.rstrip("/") + "/"):
        raise CgroupError(f"cgroup {cgroup.path} resolves to {real}, outside {top}: refusing it")
    if resolved is None and not os.path.isdir(real):
        raise CgroupError(f"cgroup {cgroup.path} does not exist under {cgroup.hierarchy}")
    if not os.path.exists(f"{folder}/cpuset.cpus"):
        raise CgroupError(f"cgroup {cgroup.path} has no cpuset.cpus: the cpuset controller is "
                          "not enabled for it (cgroup v2: the parent's cgroup.subtree_control "
                          "lacks cpuset)")


@lru_cache(maxsize=4)
def _resolved_mount(hierarchy: str) -> str:
    """The hierarchy's mount point with symlinks resolved, once per process (as ``_own_entry``)."""
    return os.path.realpath(hierarchy)


def _resolved_folder(folder: str) -> str | None:
    """The folder's path as the kernel resolved it in opening it (one open and a readlink,
    where ``os.path.realpath`` looks at every component); None when it cannot be opened as a
    folder or /proc cannot say: the caller then resolves it the slow way, which also says why."""
    try:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)


def _write(path: str, text: str) -> None:
    # os.write, not a buffered file: the kernel's ERANGE/EINVAL then arrives here and not in a
    # close() that a file object's destructor would swallow (docs/oci-hook.md, "What each
    # runtime hands a hook").
    try:
        fd = os.open(path, _WRITE_FLAGS)
    except OSError as e:
        raise CgroupError(f"cannot open {path}: {_why(e)}") from None
    try:
        os.write(fd, text.encode())
    except OSError as e:
        raise CgroupError(f"writing {text!r} to {path} failed: {_why(e)}") from None
    finally:
        os.close(fd)


def _read_list(path: str, follow: bool = False,
               expect: frozenset[int] | None = None) -> frozenset[int]:
    """A CPU or node list file. The files the hook writes are read as they are written: never
    through a symlink, never waiting on a FIFO. The effective files are only read (``follow``).
    A file that reads exactly as ``expect`` is written is that set, without parsing it."""
    data = _read_raw(path, follow)
    if expect is not None and data.strip() == _formatted(expect).encode():
        return expect
    try:
        return parse_list(data.decode("ascii", "replace"))
    except ListFormatError as e:
        raise CgroupError(f"{path}: {e}") from None


def _read_all(path: str) -> bytes:
    """A whole /proc file, read as bytes: a text file object costs more than the read."""
    fd = os.open(path, _READ_FLAGS)
    try:
        chunks = []
        while chunk := os.read(fd, _MAX_LIST_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_raw(path: str, follow: bool = False) -> bytes:
    flags = _READ_FLAGS if follow else _READ_FLAGS | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
        try:
            return os.read(fd, _MAX_LIST_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        raise CgroupError(f"cannot read {path}: {_why(e)}") from None


# The shared pool is written to every shared container alike: format it once.
_formatted = lru_cache(maxsize=64)(format_list)


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "it is a symlink (refused)"
    return e.strerror or str(e)
