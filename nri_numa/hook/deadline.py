"""The hook's deadline, counted from when its process started, and the guard that keeps it.

A runtime starts its hook timer as it starts the hook process (runc: right after exec), so the
time Python takes to start and import is already on that clock. Under a burst of container
starts on a small machine that time alone reaches seconds: fifty interpreters share two CPUs
fairly and all of them are slow at once. ``--timeout`` is therefore counted from the hook
process's own start time (``/proc/PID/stat``), not from when our code first runs: the hook
daemon reads it for the process that connected (``peer_started``), ``nri-numa hook`` for its own.

The guard keeps that deadline over ``nri-numa hook`` in its own process (nri_numa.cli.hook)
until the stage takes over with its own timer (nri_numa.hook.entry): looking for or starting the
daemon, waiting for its answer, waiting for a turn to run in process, importing the engine.
When it fires it writes the one give-up line to stderr and to the hook log, and ends the process
with ``os._exit``: nothing has been changed before the stage runs, and an interpreter with the
engine loaded can take longer to finalize on a starved CPU than the runtime still waits.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import sys
import time
from typing import Any

from nri_numa.hook.state_folder import open_state_folder

DEFAULT_TIMEOUT_S = 4.0
MAX_TIMEOUT_S = 86400.0  # a day: far above any runtime's hook timeout, and a timer can take it
LOG_NAME = "hook.log"  # in the state folder, unless --log-file says otherwise
BURST_HINT = ('too many hooks at once for this machine without the hook daemon '
              '(docs/oci-hook.md, "Burst-proof setup")')
DAEMON_HINT = ('the hook daemon had more runs queued than it could serve in that time '
               '(docs/oci-hook.md, "Burst-proof setup")')
COUNTED = "(--timeout, counted from the start of the hook process)"
_START_TIME_FIELD = 22  # /proc/PID/stat, 1-based as proc(5) counts; clock ticks after boot


class _ClosedInput:
    """What a hook reads when it was started with stdin closed (``<&-``): Python then has no
    ``sys.stdin``; reading fails as reading fd 0 would, so the run ends with one line."""

    def read(self, size: int = -1) -> bytes:
        raise OSError(9, "Bad file descriptor")


def check_timeout(seconds: float) -> None:
    """ValueError unless ``seconds`` is a deadline a timer can be armed with (nan, inf and
    values past the platform's time_t cannot)."""
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be positive and at most {MAX_TIMEOUT_S:g} s, not "
                         f"{seconds!r}")


def standard_input() -> Any:
    """The hook's stdin as bytes, or a stand-in that fails to read when stdin is closed."""
    return sys.stdin.buffer if sys.stdin is not None else _ClosedInput()


def process_age(pid: int | str = "self") -> float | None:
    """Seconds since the process was created; None when the kernel cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        # The command name (field 2) is in parentheses and may hold spaces and ')'.
        ticks = int(text.rpartition(b")")[2].split()[_START_TIME_FIELD - 3])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(age, 0.0)


def process_started() -> float:
    """When this process started, as a ``time.monotonic()`` value (now when unknown)."""
    return time.monotonic() - (process_age() or 0.0)


def peer_started(conn: socket.socket) -> float:
    """When the process at the other end of a unix socket started, as a ``time.monotonic()``
    value: that of the pid the kernel recorded as it connected. Now when the kernel cannot tell
    (a pid outside this pid namespace reads as 0)."""
    now = time.monotonic()
    try:
        pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    except OSError:
        return now
    age = process_age(pid) if pid > 0 else None
    return now - (age or 0.0)


def log_stamp() -> str:
    """The time at the start of a hook log line, as logging's asctime writes it: local time
    to the second, then the milliseconds after a comma."""
    now = time.time()
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))},{int(now % 1 * 1000):03d}"


def log_line(path: str, stage: str, line: str, level: str = "ERROR") -> None:
    """Append one line to the hook log in its format (nri_numa.hook.entry.LOG_FORMAT);
    a log that cannot be written is skipped (stderr still has the line)."""
    text = f"{log_stamp()} {level} hook[{os.getpid()}] {stage}: {line}\n".encode("utf-8", "replace")
    try:
        # Never through a symlink (the log's or its folder's), and never waiting on a FIFO put
        # there: this runs as the hook gives up, and must not be what keeps it from ending.
        folder = open_state_folder(os.path.dirname(path))
        try:
            fd = os.open(os.path.basename(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, text)
    except OSError:
        pass
    finally:
        os.close(fd)


def gave_up(timeout: float, phase: str, hint: str = "") -> str:
    """The give-up reason: the deadline, what the hook was doing, and what helps."""
    text = f"gave up after {timeout:g} s {COUNTED} while {phase}"
    return f"{text}: {hint}" if hint else text


def gave_up_early(timeout: float, what: str, hint: str = "") -> str:
    """The same for a wait cut short so that the run still ends within its deadline."""
    text = f"gave up {what}, to end within {timeout:g} s {COUNTED}"
    return f"{text}: {hint}" if hint else text


class Guard:
    """SIGALRM at the deadline: the give-up line on stderr and in the log, then exit 1.

    ``phase`` says what the hook is doing, for that line. Only the main thread can take
    signals; elsewhere (a test calling the command in a thread) the guard does nothing."""

    def __init__(self, stage: str, timeout: float, log_path: str,
                 started: float | None = None) -> None:
        self.stage = stage
        self.timeout = timeout
        self.log_path = log_path
        self.started = process_started() if started is None else started
        self.phase = "starting up (Python and nri-numa)"
        self.hint = ""
        self._previous: Any = None
        self._armed = False

    @property
    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def arm(self) -> None:
        try:
            self._previous = signal.signal(signal.SIGALRM, self._expire)
        except ValueError:  # not the main thread
            return
        signal.setitimer(signal.ITIMER_REAL, max(self.left, 0.001))
        self._armed = True

    def disarm(self) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self._armed = False

    def give_up(self) -> None:
        """Write the give-up line and end the process now."""
        line = gave_up(self.timeout, self.phase, self.hint)
        try:
            sys.stderr.write(f"nri-numa hook {self.stage}: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        log_line(self.log_path, self.stage, f"{line} ({self.elapsed_ms():.0f} ms)")
        os._exit(1)

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000

    def _expire(self, signum: int, frame: Any) -> None:
        self.give_up()
