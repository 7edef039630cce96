"""Starting ``nri-numa hook-daemon`` from a hook when none listens (``--start-daemon``): the
burst-proof setup where systemd's socket unit is not available (docs/oci-hook.md,
"Burst-proof setup").

The first hook that finds nobody accepting on ``<state-dir>/hook.sock`` takes the start lock
(``<state-dir>/hook-daemon.lock``), binds the socket itself and starts the daemon detached, with
that listening socket handed over as systemd would hand it (LISTEN_FDS, nri_numa.hook.activation).
The socket accepts connections from that moment: this hook and every other hook of the burst
connect at once and wait in its backlog while the daemon loads the engine, once, instead of
each loading it in process. A hook that waited for the lock finds the socket bound and connects.
The daemon binding a socket of its own takes the same lock, so the two never bind at once.

The daemon is a grandchild in a session of its own, its cwd ``/``, stdio ``/dev/null``, and no
other descriptor of the hook's: the runtime reads the hook's stdout and stderr until every
holder has closed them, so a daemon holding them would stall every container start. Standard
library only: this runs in the thin hook process.
"""

from __future__ import annotations

import _socket
import fcntl
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from typing import Any

from nri_numa.hook.state_folder import open_state_folder

START_LOCK_NAME = "hook-daemon.lock"
LISTEN_FDS_START = 3  # sd_listen_fds(3): the first handed-over descriptor
# The daemon's options a hook hands on: what makes the daemon answer as this hook would.
DAEMON_OPTIONS = {"config": "--config", "topology": "--topology", "log_file": "--log-file"}
_FIRST_WAIT_S = 0.001
_LAST_WAIT_S = 0.01

Connect = Callable[[str], "_socket.socket | None"]


class StartError(Exception):
    """The daemon cannot be started from this hook; the message says why."""


def take_start_lock(state_dir: str, left: Callable[[], float] | None = None) -> int | None:
    """The start lock's descriptor; None when ``left()`` ran out first. Without ``left``, wait
    as long as it takes (the holder only binds a socket and forks). OSError when the lock file
    cannot be opened, or the state folder is a symlink."""
    folder = open_state_folder(state_dir)
    try:
        fd = os.open(START_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=folder)
    finally:
        os.close(folder)
    if left is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    delay = _FIRST_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            remaining = left()
            if remaining <= 0:
                os.close(fd)
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _LAST_WAIT_S)


def bind_listener(path: str) -> socket.socket:
    """A socket listening on ``path``, mode 0600 from birth. The caller holds the start lock
    and found nobody accepting there, so a socket file left at ``path`` is stale: replaced
    (only a socket: anything else, a symlink included, is refused). OSError when its folder is
    a symlink."""
    folder = open_state_folder(os.path.dirname(path))
    name = os.path.basename(path)
    try:
        try:
            mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(mode):
                raise StartError(f"{path} exists and is not a socket; remove it")
            os.unlink(name, dir_fd=folder)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # no moment where others could connect
        try:
            # By its path: the daemon checks the name a handed-over socket reports. The folder
            # was just opened without following links; only root, who owns the folder above,
            # could swap it for a link between that and this.
            listener.bind(path)
            os.chmod(name, 0o600, dir_fd=folder)
            # A burst queues here while the daemon starts; the kernel caps it at somaxconn.
            listener.listen(socket.SOMAXCONN)
        except BaseException:
            listener.close()
            raise
        finally:
            os.umask(old_umask)
    finally:
        os.close(folder)
    return listener


def daemon_command(state_dir: str, options: dict[str, Any]) -> list[str]:
    """``nri-numa hook-daemon`` with the hook's state folder, configuration, topology and log."""
    if not sys.executable:
        raise StartError("the Python interpreter's path is unknown")
    argv = [sys.executable, "-m", "nri_numa", "hook-daemon", "--state-dir", state_dir]
    for key, flag in DAEMON_OPTIONS.items():
        if options.get(key) is not None:
            argv += [flag, options[key]]
    for value in argv[5::2]:
        # The hook's cwd is the bundle and the daemon's is /: a relative path would name another
        # file there, and the daemon would refuse this hook's options as not its own.
        if not os.path.isabs(value):
            raise StartError(f"{value} is a relative path; give the hook absolute paths")
    return argv


def connect_or_start(path: str, state_dir: str, options: dict[str, Any], connect: Connect,
                     left: Callable[[], float]) -> socket.socket | None:
    """A connection to a daemon, started here when nobody accepts on ``path``; None when the
    time ran out waiting for the start lock. StartError/OSError when it cannot be started."""
    lock = take_start_lock(state_dir, left)
    if lock is None:
        return None
    try:
        conn = connect(path)  # another hook may have started it meanwhile
        if conn is not None:
            return conn
        argv = daemon_command(state_dir, options)
        listener = bind_listener(path)
        try:
            spawn_detached(argv, listener.fileno())
        except BaseException:
            _unlink(path)  # nobody will ever accept on it
            raise
        finally:
            listener.close()  # the daemon holds its own copy
        return connect(path)
    finally:
        os.close(lock)


def spawn_detached(argv: list[str], listener_fd: int) -> None:
    """Run ``argv`` as a grandchild in a new session with ``listener_fd`` as its descriptor 3
    and LISTEN_FDS=1, LISTEN_PID set to its pid; returns once the intermediate child is reaped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    env["LISTEN_FDS"] = "1"
    pid = os.fork()
    if pid == 0:  # only os calls from here to exec: this is a fork of the hook process
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            if listener_fd != LISTEN_FDS_START:
                os.dup2(listener_fd, LISTEN_FDS_START)
            os.set_inheritable(LISTEN_FDS_START, True)
            _close_from(LISTEN_FDS_START + 1)
            env["LISTEN_PID"] = str(os.getpid())
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise StartError(f"could not start {argv[0]} (status {status})")


def _close_from(first: int) -> None:
    """Close every descriptor from ``first`` on: the open ones, as /proc lists them (the limit
    may be a billion, too many to close one by one)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(first, 1 << 16))
    for fd in fds:
        if fd >= first:
            try:
                os.close(fd)
            except OSError:
                pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
