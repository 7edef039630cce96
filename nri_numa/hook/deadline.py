"""The hook's deadline, counted from when its process started, and the guard that keeps it.

A runtime starts its hook timer as it starts the hook process (runc: right after exec), so the
time Python takes to start and import is already on that clock. Under a burst of container
starts on a small machine that time alone reaches seconds: fifty interpreters share two CPUs
fairly and all of them are slow at once. ``--timeout`` is therefore counted from the process's
own start time (``/proc/self/stat``), not from when our code first runs.

The guard is armed as soon as the hook's arguments are known (nri_numa.hook.client, standard
library only) and covers everything before the stage takes over its own timer
(nri_numa.hook.entry): parsing, imports, waiting for the daemon or for a turn to run in process.
When it fires it writes the one give-up line to stderr and to the hook log, and ends the process
with ``os._exit``: nothing has been changed before the stage runs, and an interpreter with the
engine loaded can take longer to finalize on a starved CPU than the runtime still waits.

Standard library only: every hook process imports this before anything else of nri_numa.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from typing import Any

from nri_numa.hook.state_folder import open_state_folder

BURST_HINT = ('too many hooks at once for this machine without the hook daemon '
              '(docs/oci-hook.md, "Burst-proof setup")')
DAEMON_HINT = ('the hook daemon had more runs queued than it could serve in that time '
               '(docs/oci-hook.md, "Burst-proof setup")')
COUNTED = "(--timeout, counted from the start of the hook process)"
_START_TIME_FIELD = 22  # /proc/PID/stat, 1-based as proc(5) counts; clock ticks after boot

ACTIVE: Guard | None = None  # the guard of the hook command running in this process


class _ClosedInput:
    """What a hook reads when it was started with stdin closed (``<&-``): Python then has no
    ``sys.stdin``; reading fails as reading fd 0 would, so the run ends with one line."""

    def read(self, size: int = -1) -> bytes:
        raise OSError(9, "Bad file descriptor")


def standard_input() -> Any:
    """The hook's stdin as bytes, or a stand-in that fails to read when stdin is closed."""
    return sys.stdin.buffer if sys.stdin is not None else _ClosedInput()


def process_age() -> float:
    """Seconds since this process was created; 0.0 when the kernel cannot tell."""
    try:
        with open("/proc/self/stat", "rb") as f:
            text = f.read()
        # The command name (field 2) is in parentheses and may hold spaces and ')'.
        ticks = int(text.rpartition(b")")[2].split()[_START_TIME_FIELD - 3])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(age, 0.0)


def process_started() -> float:
    """When this process started, as a ``time.monotonic()`` value."""
    return time.monotonic() - process_age()


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
