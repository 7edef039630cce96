"""The agent's log: one line per event, as text for people or as JSON lines for collectors.

Decisions are logged with their facts as fields (``extra=`` on the logging call, built by
``decision_fields`` and ``refusal_fields``): the text format shows the message, which already
says everything in words; the JSON format writes the message *and* every field, so that a log
pipeline can select on ``event``, ``pod``, ``cpus`` without parsing prose.

A log file is opened as the state is (nri_numa.safeio.safe_files): its folder and the file
without following a symlink, never waiting on a FIFO. A log file that is a symlink or not a
file is not written; the log goes to standard error with a warning instead, since the agent's
work matters more than where its log lands. The agent's log file is bounded: once a line takes
it past LOG_KEEP_BYTES it moves to ``<name>.1`` (replacing the one before) and the next line
starts a new file, so the two never hold much more than twice that.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nri_numa.safeio.bounds import printable
from nri_numa.safeio.log_files import LogFileRefused, open_log_descriptor, open_log_stream
from nri_numa.topology.cpulist import format_cached

if TYPE_CHECKING:
    from nri_numa.engine.decision import Placement

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The agent's log file moves to <name>.1 past this many bytes; one old file is kept.
LOG_KEEP_BYTES = 8 << 20
# What every LogRecord has: anything else on a record came in through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class OneLineFormatter(logging.Formatter):
    """A text formatter whose lines stay one per event: a newline, a control character or a
    lone surrogate in a logged value (a container name, an id off a hook's stdin) is written
    as its escape, so that it can neither start a forged line nor fail the write. A
    traceback after the line keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        return text if text.isprintable() else printable(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, msg, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=_plain, separators=(",", ":"))


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def _plain(value: Any) -> Any:
    """Fields JSON has no type for: sets as sorted lists, anything else as its text."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Mapping):
        return dict(value)
    return str(value)


_configured = False


def configured() -> bool:
    """Whether ``configure`` set up the agent's log: where the CLI sends a bug's traceback."""
    return _configured


def configure(level: str = "info", fmt: str = "text", file: Path | None = None) -> None:
    """Send every logger's records to ``file`` (appended, rotated past LOG_KEEP_BYTES) or
    standard error, in ``fmt``. A file that is a symlink or not a file: standard error, and a
    warning there."""
    global _configured
    _configured = True
    refused = None
    try:
        handler: logging.Handler = (open_log_file(file, rotate_past=LOG_KEEP_BYTES)
                                    if file is not None else logging.StreamHandler(sys.stderr))
    except LogFileRefused as e:
        handler, refused = logging.StreamHandler(sys.stderr), e
    handler.setFormatter(JsonFormatter() if fmt == "json" else OneLineFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    if refused is not None:
        logging.getLogger(__name__).warning("%s; logging to standard error", refused)


def open_log_file(path: Path, *, create_folder: bool = False, rotate_past: int | None = None,
                  quiet: bool = False) -> logging.Handler:
    """A handler appending to ``path``, opened as nri_numa.safeio.log_files opens it (the
    errors it raises, and with the same options). ``rotate_past``: also while it writes, a
    line that takes the file past that many bytes moves it to ``<name>.1``, and the next line
    goes to a new file at ``path``. ``quiet``: a line the file cannot take (a full disk) is
    dropped without a word, where logging would report it on standard error (a hook's
    standard error is its answer to the runtime)."""
    fd = open_log_descriptor(path, create_folder=create_folder, rotate_past=rotate_past)
    return _OwnFileHandler(fd, path, rotate_past, quiet)


class _OwnFileHandler(logging.StreamHandler):
    """A StreamHandler on a descriptor opened here, closed with the handler (FileHandler
    opens by name, following whatever the name points to)."""

    def __init__(self, fd: int, path: Path | None = None, rotate_past: int | None = None,
                 quiet: bool = False) -> None:
        super().__init__(open_log_stream(fd))
        self._path, self._rotate_past, self._quiet = path, rotate_past, quiet

    def handleError(self, record: logging.LogRecord) -> None:
        if not self._quiet:
            super().handleError(record)

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)  # called with the handler's lock held (Handler.handle)
        if self._rotate_past is not None:
            self._rotate_when_full()

    def _rotate_when_full(self) -> None:
        """The file past ``rotate_past`` moves to ``<name>.1`` and a new one is opened as the
        first was. When either step fails the log goes on in the file it has, and the next
        line tries again: losing lines would be worse than a large file."""
        assert self._path is not None and self._rotate_past is not None
        try:
            if os.fstat(self.stream.fileno()).st_size <= self._rotate_past:
                return
            fd = open_log_descriptor(self._path, rotate_past=self._rotate_past)
        except (OSError, ValueError):  # LogSetupError is a ValueError
            return
        old, self.stream = self.stream, open_log_stream(fd)
        try:
            old.close()
        except OSError:
            pass

    def close(self) -> None:
        self.acquire()
        try:
            self.stream.close()
        except OSError:  # the last lines could not be written
            if not self._quiet:
                raise
        finally:
            self.release()
        super().close()


# --- the fields of a decision ----------------------------------------------------------------


def decision_fields(event: str, pod: str, pod_uid: str, container_id: str, policy: str,
                    placement: Placement) -> dict[str, Any]:
    """A placed (or adopted) container: where it runs and why there."""
    hint = placement.hint
    return {"event": event, "pod": pod, "pod_uid": pod_uid, "container": placement.container,
            "container_id": container_id, "policy": policy,
            "hint": None if hint.affinity is None else sorted(hint.affinity),
            "preferred": hint.preferred, "cpus": format_cached(placement.cpus),
            "exclusive": placement.exclusive,
            "mems": None if placement.mems is None else format_cached(placement.mems),
            "devices": {k: list(v) for k, v in placement.devices.items()}}


def repair_fields(pod: str, pod_uid: str, container: str, container_id: str,
                  cpus: frozenset[int], mems: frozenset[int] | None, why: str) -> dict[str, Any]:
    """A cpuset sent again to a container whose cgroup did not get it."""
    return {"event": "repaired", "pod": pod, "pod_uid": pod_uid, "container": container,
            "container_id": container_id, "cpus": format_cached(cpus),
            "mems": None if mems is None else format_cached(mems), "detail": why}


def refusal_fields(pod: str, pod_uid: str, container: str, container_id: str, policy: str | None,
                   reason: str, resource: str | None, message: str) -> dict[str, Any]:
    """A refused container: the kubelet's reason, the resource that did not fit, the text."""
    return {"event": "refused", "pod": pod, "pod_uid": pod_uid, "container": container,
            "container_id": container_id, "policy": policy, "reason": reason,
            "resource": resource, "detail": message}
