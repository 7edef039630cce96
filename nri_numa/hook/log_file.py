"""The hook log (``<state-dir>/hook.log`` or ``--log-file``), written without ``logging``.

One line per event, ``<local time>,<ms> <LEVEL> hook[<pid>] <message>``, escaped as the agent's
text log is: a newline, a control character or a lone surrogate in a logged value (a container
name, an id off a hook's stdin) is written as its escape, so that it can neither start a forged
line nor fail the write; a traceback after the line keeps its lines. The file is opened as the
state is (nri_numa.safeio.log_files) and moves to ``hook.log.1`` past LOG_KEEP_BYTES.
"""

from __future__ import annotations

import os

from nri_numa.hook.deadline import log_stamp
from nri_numa.safeio.bounds import printable
from nri_numa.safeio.log_files import open_log_descriptor, open_log_stream

TYPE_CHECKING = False  # as typing.TYPE_CHECKING: a hook process does not import typing
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO, Any

LOG_KEEP_BYTES = 1 << 20  # then the log moves to hook.log.1 (one old file is kept)
LEVEL_NAMES = {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR", 50: "CRITICAL"}


class HookLog:
    """Where a hook run's lines go (a nri_numa.deferred_log sink); ``None`` drops them."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream

    def write(self, level: int, message: str, exc_info: Any = None) -> None:
        if self._stream is None:
            return
        line = f"{log_stamp()} {LEVEL_NAMES.get(level, level)} hook[{os.getpid()}] {message}"
        if not line.isprintable():
            line = printable(line)
        if exc_info and exc_info[0] is not None:
            import traceback  # only for a failure nobody foresaw

            line += "\n" + "".join(traceback.format_exception(*exc_info)).rstrip("\n")
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a full disk costs the line, never the run: its stderr says what matters

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError:
                pass
            self._stream = None


def open_hook_log(path: Path) -> HookLog:
    """The log at ``path`` (its folder made when missing). LogFileRefused when it or its
    folder is a symlink or the file not a file; LogSetupError when it cannot be opened
    (nri_numa.safeio.log_files)."""
    return HookLog(open_log_stream(open_log_descriptor(path, create_folder=True,
                                                       rotate_past=LOG_KEEP_BYTES)))

