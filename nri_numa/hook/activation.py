"""A listening socket handed to ``nri-numa hook-daemon`` by whoever started it: systemd's socket
unit (packaging/nri-numa-hook-daemon.socket) or a hook that started it on demand
(nri_numa.hook.ondemand). The protocol is systemd's (sd_listen_fds(3)): ``LISTEN_PID`` is the
pid the descriptors are meant for, ``LISTEN_FDS`` their count, from descriptor 3 on.

Written out here rather than taken from a library: it is a few lines, and the daemon takes
exactly one socket, the one at ``<state-dir>/hook.sock`` where the hooks look.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from pathlib import Path

LISTEN_FDS_START = 3
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(Exception):
    """Descriptors were handed over but are not the one socket the daemon can serve."""


def inherited_listener(expected: Path,
                       environ: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The handed-over listening socket, or None when nothing was handed to this process."""
    env = os.environ if environ is None else environ
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    if pid is None or count is None or pid != str(os.getpid()):
        return None  # nothing, or variables a parent got and passed on by mistake
    for name in _VARIABLES:  # meant for this process only, not for anything it starts
        env.pop(name, None)
    if count != "1":
        raise ActivationError(f"LISTEN_FDS={count}: the hook daemon serves exactly one socket "
                              f"(the socket unit's ListenStream={expected})")
    try:
        listener = socket.socket(fileno=LISTEN_FDS_START)
    except OSError as e:
        raise ActivationError(f"descriptor {LISTEN_FDS_START} handed over is not a socket: "
                              f"{e.strerror}") from None
    try:
        _check(listener, expected)
    except BaseException:
        listener.detach()  # not ours to close: report and leave it
        raise
    listener.set_inheritable(False)
    listener.setblocking(True)
    return listener


def _check(listener: socket.socket, expected: Path) -> None:
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM \
            or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise ActivationError(f"descriptor {LISTEN_FDS_START} handed over is not a listening "
                              "unix stream socket (the socket unit needs ListenStream=)")
    name = listener.getsockname()
    if not isinstance(name, str) or not _same_file(name, expected):
        raise ActivationError(f"the socket handed over listens on {name or '(no path)'}, but "
                              f"hooks look for {expected}: give the socket unit "
                              f"ListenStream={expected}, or the daemon the --state-dir it lies in")


def _same_file(name: str, expected: Path) -> bool:
    try:
        return os.path.samefile(name, expected)
    except OSError:
        return Path(name) == expected
