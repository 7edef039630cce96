"""Turns for hooks that run in process: at most one per CPU loads the engine at a time.

A hook that runs in process spends most of its CPU importing the engine before it even waits
for the ledger lock. Fifty of them started at once on two CPUs share the CPUs fairly, so all of them
are still importing when their deadline comes and none places anything. Taking a turn first
(one lock file per CPU the hook may run on, ``<state-dir>/hook.turn.N``) lets the first few
finish in time while the rest sleep and give up with a reason instead.

A turn is an ``flock`` held until the process exits (or ``release``); a hook killed while it
holds one gives it back with its file descriptors. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable

from nri_numa.hook.state_folder import open_state_folder

TURN_PREFIX = "hook.turn."
_FIRST_WAIT_S = 0.002
_LAST_WAIT_S = 0.02


def turn_count() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except OSError:
        return max(os.cpu_count() or 1, 1)


def take_turn(state_dir: str, left: Callable[[], float], count: int | None = None) -> int | None:
    """A held turn's file descriptor, waiting while ``left()`` stays positive; None when the
    time ran out or the turn files cannot be made (the run then goes on without one: it fails
    or succeeds on its own, but never waits here past its deadline)."""
    count = turn_count() if count is None else count
    fds: list[int] = []
    try:
        folder = open_state_folder(state_dir)  # never made through a symlinked folder
        try:
            for i in range(count):
                fds.append(os.open(f"{TURN_PREFIX}{i}",
                                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                   dir_fd=folder))
        finally:
            os.close(folder)
    except OSError:
        _close(fds)
        return None
    delay = _FIRST_WAIT_S
    start = os.getpid() % count  # spread the first tries over the turns
    while True:
        for i in range(count):
            fd = fds[(start + i) % count]
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            _close(f for f in fds if f != fd)
            return fd
        remaining = left()
        if remaining <= 0:
            _close(fds)
            return None
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _LAST_WAIT_S)


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)
