"""The hook's thin client: hand a hook run to ``nri-numa hook-daemon``, wait for its exit status.

The shipped hooks run it by path, in nri-numa's interpreter, with nothing of nri-numa loaded::

    /opt/nri-numa/venv/bin/python3 -I -S .../nri_numa/hook/client.py createRuntime ...

The compiled client (nri-numa-hook-client, from c_client/) does exactly the same, faster.

The wire, as Mercurial's chg hands a command to its server. The client connects to the unix
socket named by ``$NRI_NUMA_HOOK_SOCKET`` (default ``/run/nri-numa/hook.sock``: give the hook's
``env`` that variable when its ``--state-dir`` is another folder), sends its arguments (those
after the program's name, each ended by a NUL byte) with its descriptors 0, 1 and 2 attached
(``SCM_RIGHTS``), shuts down its side for writing, and reads one byte: the run's exit status, which
it exits with. The daemon reads the arguments with the parser of ``nri-numa hook``, the OCI state
from the passed stdin, writes the run's output to the passed stdout and stderr, and counts
``--timeout`` from the start of the process that connected (``SO_PEERCRED``, ``/proc/PID/stat``):
the client parses nothing and keeps no timer. A daemon that closes the connection without that
byte fails the hook closed, with one line on stderr: it may have placed the container already.

With no daemon (no socket there, nobody accepting on it), no arguments, or a standard descriptor
closed (none to hand over), the client execs ``nri-numa hook`` with the same arguments in its
interpreter (``-I``, with ``site``; the C client: ``PYTHON -I -m nri_numa hook``), which runs
the hook in that process or, with ``--start-daemon``, starts a daemon and hands it the run
(nri_numa.cli.hook). The exec keeps the pid and so the start time the deadline counts from.

Standard library only: ``nri-numa hook`` imports this module too, for the same wire. The socket
is ``_socket``'s, the C type under the ``socket`` module: that module's import (``enum``,
``selectors``) is most of what this client costs above a bare interpreter.
"""

from __future__ import annotations

import _socket
import os
import sys

SOCKET_ENV = "NRI_NUMA_HOOK_SOCKET"
DEFAULT_STATE_DIR = "/run/nri-numa"
SOCKET_NAME = "hook.sock"
DEFAULT_SOCKET = f"{DEFAULT_STATE_DIR}/{SOCKET_NAME}"
STANDARD_FDS = (0, 1, 2)
# ``python -I -c RUN_HOOK ROOT hook ARGS``: nri_numa from ROOT unless site found it first.
RUN_HOOK = "import sys; sys.path.append(sys.argv.pop(1)); from nri_numa.cli import main; main()"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def standard_fds_open() -> bool:
    for fd in STANDARD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


def connect(path: str) -> _socket.socket | None:
    """A connection to the daemon at ``path``; None when none listens there. OSError when
    something there cannot be reached (no permission, a path too long)."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    except BaseException:
        conn.close()
        raise
    return conn


def hand_over(conn: _socket.socket, args: list[str]) -> int | None:
    """Send ``args`` and this process's standard descriptors on ``conn`` and close it: the exit
    status the daemon answers, None when it closed the connection without one. OSError when
    the connection fails."""
    payload = b"".join(os.fsencode(arg) + b"\0" for arg in args)
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in STANDARD_FDS)  # C ints
    try:
        sent = conn.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        conn.sendall(payload[sent:])
        conn.shutdown(_socket.SHUT_WR)
        status = conn.recv(1)
    finally:
        conn.close()
    return status[0] if status else None


def unanswered(path: str, error: OSError | None = None) -> str:
    """Why a hook fails when the daemon at ``path`` took its run and did not answer."""
    if error is None:
        return f"the hook daemon at {path} closed the connection before answering"
    return f"the hook daemon at {path} failed before answering: {error.strerror or error}"


def unreachable(path: str, error: OSError) -> str:
    return f"cannot reach the hook daemon at {path}: {error.strerror or error}"


def run_in_python(args: list[str]) -> None:
    """Become ``nri-numa hook ARGS`` in this interpreter, with ``site`` (its packages) and the
    folder this client's package lies in (a source tree need not be installed there)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, [sys.executable, "-I", "-c", RUN_HOOK, root, "hook", *args])


def main(args: list[str]) -> int:
    path = socket_path()
    try:
        conn = connect(path) if args and standard_fds_open() else None
    except OSError as e:
        return _fail(unreachable(path, e))
    if conn is None:
        run_in_python(args)
    try:
        code = hand_over(conn, args)
    except OSError as e:
        return _fail(unanswered(path, e))
    return _fail(unanswered(path)) if code is None else code


def _fail(reason: str) -> int:
    print(f"nri-numa hook: {reason}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
