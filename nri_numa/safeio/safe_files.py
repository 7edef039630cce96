"""Files in nri-numa's folders, opened so that nothing planted there is followed or waited on.

The state folders are root's and mode 0700, yet what lies in them can still be damaged or
planted: a symlink where a file should be would make a write land wherever it points, a FIFO
would block a reader until some writer comes (before the agent serves, or past the hook's
timer), and a folder or a huge file would fail or flood a read. So:

* a folder is opened with ``O_DIRECTORY|O_NOFOLLOW`` and its files relative to that
  descriptor: a state folder that is itself a symlink is refused, and one swapped for a symlink
  after it was opened changes nothing;
* files are opened with ``O_NOFOLLOW|O_NONBLOCK`` and checked with ``fstat`` (after an
  ``lstat``, so that a device node is never even opened): regular files only, and a FIFO
  answers at once instead of blocking;
* reads stop at a size limit.

Only the last part of a path is checked: the folders above it (``/var/run`` → ``/run``) are the
system's, and legitimately links.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ = os.O_RDONLY
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT
LOCK = os.O_RDWR | os.O_CREAT
CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL


class UnusableFile(Exception):
    """A file or folder that cannot be used as it is. ``str()`` is one line naming it;
    ``why`` is the reason alone."""

    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = Path(path)
        self.why = why


class NotAFile(UnusableFile):
    """Something other than what belongs there: a symlink, a folder, a FIFO, a device, or a
    file past the size limit. Damage or a plant, never a setting."""


@dataclass(frozen=True, slots=True)
class FileContents:
    data: bytes
    mtime: float  # seconds since the epoch


def kind(mode: int) -> str:
    """What a file is, for messages: "a symlink", "a FIFO", …"""
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "an unknown kind of file"


def open_folder(path: Path, *, create: bool = False) -> int | None:
    """A descriptor of the folder ``path``; None when it does not exist and ``create`` is
    false. With ``create``, a missing folder is made (mode 0700, with its parents).
    NotAFile when ``path`` is a symlink or not a folder; UnusableFile when it cannot be opened."""
    for _ in range(3):  # made, then removed by someone before we opened it: make it again
        try:
            return os.open(path, _FOLDER_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise NotAFile(path, _not_a_folder(path)) from None
            raise UnusableFile(path, f"cannot open the folder: {e.strerror}") from None
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # a dangling symlink, or a file: the open above names it
            pass
        except OSError as e:
            raise UnusableFile(path, f"cannot create the folder: {e.strerror}") from None
    raise UnusableFile(path, "the folder keeps disappearing")


def open_file(name: str | Path, flags: int, *, folder: int | None = None,
              shown: Path | str | None = None, mode: int = 0o600,
              devices: bool = False) -> int:
    """``os.open`` of a regular file without following a symlink or waiting on a FIFO, relative
    to the ``folder`` descriptor when given; ``devices`` also lets a character device through
    (/dev/null as a log). The descriptor is blocking again once checked. NotAFile for anything
    else; OSError as ``os.open`` raises it otherwise (the caller words it)."""
    shown = shown if shown is not None else name
    try:
        before = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        _check_kind(before.st_mode, shown, devices)  # a device node is never opened blind
    try:
        fd = os.open(name, flags | _SAFE, mode, dir_fd=folder)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotAFile(shown, "it is a symlink (not followed)") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):  # a folder or a socket, swapped in just now
            raise NotAFile(shown, "it is not a regular file") from None
        raise
    try:
        _check_kind(os.fstat(fd).st_mode, shown, devices)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(name: str, folder: int, limit: int, shown: Path | str) -> FileContents | None:
    """The bytes of the regular file ``name`` in the ``folder`` descriptor; None when there is
    none. NotAFile when it is anything else or longer than ``limit`` bytes; UnusableFile when
    it cannot be read."""
    try:
        fd = open_file(name, READ, folder=folder, shown=shown)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnusableFile(shown, f"cannot read it: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_size > limit:
            raise NotAFile(shown, f"it is larger than {_size(limit)}")
        chunks, total = [], 0
        while chunk := os.read(fd, min(limit + 1 - total, 1 << 20)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while being read
                raise NotAFile(shown, f"it is larger than {_size(limit)}")
        return FileContents(b"".join(chunks), info.st_mtime)
    except OSError as e:
        raise UnusableFile(shown, f"cannot read it: {e.strerror}") from None
    finally:
        os.close(fd)


def lexists(name: str, folder: int) -> bool:
    """Whether ``name`` exists in the folder, a dangling symlink included."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def corrupt_name(name: str, folder: int, seconds: float) -> str:
    """A free name in the folder to set ``name`` aside under: ``<name>.corrupt-<UTC time>``,
    then ``-2``, ``-3``, ... when that exists."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(seconds))
    chosen, n = f"{name}.corrupt-{stamp}", 1
    while lexists(chosen, folder):
        n += 1
        chosen = f"{name}.corrupt-{stamp}-{n}"
    return chosen


def _check_kind(mode: int, shown: Path | str, devices: bool) -> None:
    if stat.S_ISREG(mode) or (devices and stat.S_ISCHR(mode)):
        return
    if stat.S_ISLNK(mode):
        raise NotAFile(shown, "it is a symlink (not followed)")
    raise NotAFile(shown, f"it is {kind(mode)}, not a regular file")


def _not_a_folder(path: Path) -> str:
    try:
        what = kind(os.lstat(path).st_mode)
    except OSError:
        return "it is not a folder"
    if what == "a symlink":
        return "it is a symlink: refusing to use it as a folder (give the folder it points to)"
    return f"it is {what}, not a folder"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def unlink_quietly(name: str, folder: int) -> None:
    """Remove ``name`` in the open ``folder`` when it is there; clean-up never fails a write."""
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass
