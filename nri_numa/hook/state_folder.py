"""The hook's state folder as the thin hook paths open it: standard library only.

The turn files, the daemon's start lock and socket, and the hook log line written as a run
gives up are made before the engine loads. The folder is opened without following a symlink
and the files are made relative to it (``dir_fd``), so that a state folder someone replaced with
a link never gets them where the link points. nri_numa.safeio.safe_files does the same for everything else; it is not imported here,
since importing nri_numa.state loads the ledger and the engine.
"""

from __future__ import annotations

import os

_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_state_folder(path: str) -> int:
    """A descriptor of the folder ``path``, made (mode 0700, with its parents) when missing.
    OSError when it cannot be made or opened: ENOTDIR or ELOOP when it is a symlink or not a
    folder."""
    try:
        return os.open(path or ".", _FLAGS)
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return os.open(path, _FLAGS)

