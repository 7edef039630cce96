"""Damaged and planted state files, made the same way for every test that needs one: what a
crash, a full disk, a person or an attacker with a shell can leave where nri-numa keeps a file."""

from __future__ import annotations

import os
import socket
from pathlib import Path

# What each damage leaves, and the reason nri-numa gives for it (a part of its one line).
DAMAGES = {
    "nested": "JSON nested deeper than 64 levels",
    "digits": "holds a number of more than 40 digits",
    "directory": "it is a directory, not a regular file",
    "fifo": "it is a FIFO, not a regular file",
    "socket": "it is a socket, not a regular file",
    "symlink": "it is a symlink (not followed)",
    "huge": "it is larger than 64 MiB",
}
# A file some other program owns, which a symlink points at: it must never change.
VICTIM_TEXT = "a file nri-numa must never write\n"


def damage(path: Path, kind: str) -> Path | None:
    """Put the ``kind`` of damage at ``path`` (its folder made); the victim file a symlink points
    at, else None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "nested":
        path.write_bytes(b"[" * 100_000)
    elif kind == "digits":  # a version followed by 5000 digits
        path.write_bytes(b'{"format": "nri-numa-checkpoint", "version": 1' + b"0" * 5000 + b"}")
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("kept\n")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
    elif kind == "symlink":
        victim = path.parent.parent / f"victim-of-{path.name}"
        victim.write_text(VICTIM_TEXT)
        path.symlink_to(victim)
        return victim
    elif kind == "huge":  # sparse: no disk is used, but the size is past the limit
        with open(path, "wb") as f:
            f.truncate((64 << 20) + 1)
    else:
        raise ValueError(kind)
    return None


def snapshot(folder: Path) -> dict[str, tuple[int, int, str | None]]:
    """name → (mode, size, link target) of everything in ``folder``, links not followed."""
    out = {}
    for entry in sorted(folder.iterdir()):
        info = entry.lstat()
        target = os.readlink(entry) if entry.is_symlink() else None
        out[entry.name] = (info.st_mode, info.st_size, target)
    return out
