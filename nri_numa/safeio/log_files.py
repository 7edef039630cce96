"""Opening a log file the way the state is opened (nri_numa.safeio.safe_files): its folder and
the file without following a symlink, never waiting on a FIFO, mode 0600 when made. The logging
handlers of the agent, the hook daemon and each hook run sit on the descriptor this gives
(nri_numa.agent.logs.open_log_file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nri_numa.safeio.safe_files import APPEND, NotAFile, UnusableFile, open_file, open_folder


class LogSetupError(ValueError):
    """The log cannot be opened; the message names the file."""


class LogFileRefused(LogSetupError):
    """The log file, or its folder (``folder`` true), is a symlink or not what it should be:
    damage or a plant, not a setting. The message is one line naming it."""

    def __init__(self, message: str, folder: bool = False) -> None:
        super().__init__(message)
        self.folder = folder


def open_log_descriptor(path: Path, *, create_folder: bool = False,
                        rotate_past: int | None = None) -> int:
    """A descriptor appending to ``path``. ``create_folder``: make its folder when missing;
    ``rotate_past``: a file larger than that many bytes moves to ``<name>.1`` first.
    LogFileRefused when the file or its folder is a symlink, or the file is neither a regular
    file nor a character device (/dev/null); LogSetupError when it cannot be opened."""
    try:
        folder = open_folder(path.parent, create=create_folder)
    except NotAFile as e:
        raise LogFileRefused(f"not logging to {path}: {e}", folder=True) from None
    except UnusableFile as e:
        raise LogSetupError(f"cannot open log file {path}: {e.why}") from None
    if folder is None:
        raise LogSetupError(f"cannot open log file {path}: No such file or directory")
    try:
        if rotate_past is not None:
            _rotate(folder, path.name, rotate_past)
        return open_file(path.name, APPEND, folder=folder, shown=path, devices=True)
    except NotAFile as e:
        raise LogFileRefused(f"not logging to {e}") from None
    except OSError as e:
        raise LogSetupError(f"cannot open log file {path}: {e.strerror}") from None
    finally:
        os.close(folder)


def open_log_stream(fd: int):  # -> TextIO
    """The text stream a log writes through: "w" on a descriptor truncates nothing (O_APPEND
    puts every write at the end), and a value that cannot be encoded is written escaped."""
    return os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")


def _rotate(folder: int, name: str, limit: int) -> None:
    # The rename moves whatever has the name, a link included, and follows nothing.
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            os.replace(name, name + ".1", src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        pass  # not rotated: the log grows on, or the open below says what is wrong
