"""Which process a container is, in a form that survives exec and detects pid reuse.

A container's init keeps its pid and its start time (field 22 of ``/proc/PID/stat``, in clock
ticks since boot) across the exec into the workload, while a new process that happens to get the
same pid has another start time. The pair is what the ledger records, and what tells a running
container from an allocation whose container is long gone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_START_TIME_FIELD = 22  # 1-based, as proc(5) counts


@dataclass(frozen=True, slots=True)
class ProcessId:
    pid: int
    start: int  # clock ticks after boot


def process_id(proc: Path, pid: int) -> ProcessId | None:
    """The process ``pid`` now; None when there is none."""
    # os calls on a str path: the daemon checks every placed container at each run, and
    # pathlib's joins and text wrapper cost more than the read itself.
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    index = _START_TIME_FIELD - 3  # fields after the name start at field 3
    if not paren or len(fields) <= index or not fields[index].isdigit():
        return None
    return ProcessId(pid, int(fields[index]))


def is_running(proc: Path, ident: ProcessId) -> bool:
    return process_id(proc, ident.pid) == ident
