"""The thin hook client: hand one hook run to the resident daemon (``nri-numa hook-daemon``).

Loading the engine costs a hook process far more than its work, so when a daemon listens on
``<state-dir>/hook.sock`` the hook process only forwards its stage, stdin and options and prints
the answer. Standard library only, and imported before anything else of nri_numa: every
millisecond here is paid by every container start.

When no daemon listens (no socket, or a socket nobody accepts on) the caller runs the hook in
process, as without a daemon, or, with ``--start-daemon``, starts one (nri_numa.hook.ondemand)
and hands it the run. Once connected, the daemon's answer is final, and a daemon that dies or
stalls before answering fails the hook closed: it may have placed the container already, so
running the stage again here could not be trusted to agree with it.

Every path out of here ends within ``--timeout`` counted from the process's start (the guard of
nri_numa.hook.deadline, armed by ``guarded`` before anything else runs).

Wire format: one JSON line each way. Request ``{"stage", "stdin", "options"}`` (stdin decoded
with surrogateescape, so any bytes survive); reply ``{"exit", "stdout", "stderr"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from nri_numa.hook import deadline

if TYPE_CHECKING:
    import socket

SOCKET_NAME = "hook.sock"
DEFAULT_STATE_DIR = "/run/nri-numa"  # as nri_numa.hook.entry.DEFAULT_STATE_DIR
DEFAULT_TIMEOUT_S = 4.0  # as nri_numa.hook.entry.DEFAULT_TIMEOUT_S
MAX_TIMEOUT_S = 86400.0  # as nri_numa.hook.entry.MAX_TIMEOUT_S
MAX_LINE = 64 << 20  # an OCI spec is a few KiB; this only stops a runaway peer
STAGES = ("createRuntime", "prestart", "poststop", "precreate")
# The hook's options with a value (nri_numa.cli.hook.add_parser), as the daemon's request keys.
VALUE_OPTIONS = {"--state-dir": "state_dir", "--config": "config", "--topology": "topology",
                 "--log-file": "log_file", "--timeout": "timeout",
                 "--cgroup-root": "cgroup_root", "--proc-root": "proc_root"}
# The hook's options without a value; they steer this client and are not sent to the daemon.
FLAG_OPTIONS = {"--start-daemon": "start_daemon"}
LOG_NAME = "hook.log"  # as nri_numa.hook.entry.LOG_NAME


class ProtocolError(Exception):
    """A request or reply line that is not what the other side must send."""


def parse_hook_args(args: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(stage, options) from ``hook``'s arguments; None for anything argparse must judge
    (help, a bad stage, an unknown or incomplete option). Flags are True in the options."""
    stage: str | None = None
    options: dict[str, Any] = {}
    rest = iter(args)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if arg in FLAG_OPTIONS:
            options[FLAG_OPTIONS[arg]] = True
        elif name in VALUE_OPTIONS:
            if not eq:
                value = next(rest, None)
                if value is None:
                    return None
            options[VALUE_OPTIONS[name]] = value
        elif arg in STAGES and stage is None:
            stage = arg
        else:
            return None
    return None if stage is None else (stage, options)


def encode_request(stage: str, stdin: bytes, options: dict[str, Any]) -> bytes:
    text = stdin.decode("utf-8", "surrogateescape")
    return json.dumps({"stage": stage, "stdin": text, "options": options}).encode() + b"\n"


def decode_reply(line: bytes) -> tuple[int, str, str]:
    try:
        reply = json.loads(line)
    except ValueError:
        raise ProtocolError("the hook daemon's answer is not JSON") from None
    if not isinstance(reply, dict):
        raise ProtocolError("the hook daemon's answer is not a JSON object")
    code, out, err = reply.get("exit"), reply.get("stdout"), reply.get("stderr")
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(out, str) \
            or not isinstance(err, str):
        raise ProtocolError("the hook daemon's answer lacks exit, stdout or stderr")
    return code, out, err


def read_stdin(stdin: Any) -> bytes:
    """Everything on stdin, up to MAX_LINE bytes (the daemon drops a longer request line);
    ProtocolError past that."""
    data = stdin.read(MAX_LINE + 1)
    if len(data) > MAX_LINE:
        raise ProtocolError(f"more than {MAX_LINE} bytes on stdin, which is no OCI state")
    return data


def read_line(conn: socket.socket) -> bytes:
    """One newline-terminated line; ProtocolError when the peer closes first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ProtocolError("the connection closed before a whole line came")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")


def connect(path: str, timeout: float) -> socket.socket | None:
    """A connection to the daemon, or None when none listens there."""
    import socket  # here: a hook process that already knows no daemon listens never loads it

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    except BaseException:
        conn.close()
        raise
    return conn


def hook_timeout(options: dict[str, Any]) -> float | None:
    """``--timeout`` in seconds; None when argparse must word the error."""
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError:
        return None
    # Past a day (nri_numa.hook.entry.MAX_TIMEOUT_S) the timer overflows: argparse's path
    # refuses it in one line.
    return timeout if 0 < timeout <= MAX_TIMEOUT_S else None


@contextmanager
def guarded(args: list[str]) -> Iterator[deadline.Guard | None]:
    """The hook's deadline guard, armed for the whole command and disarmed after it (a test
    may run the command inside its own process); None when argparse must judge the args."""
    parsed = parse_hook_args(args)
    timeout = None if parsed is None else hook_timeout(parsed[1])
    if parsed is None or timeout is None:
        yield None
        return
    stage, options = parsed
    log_path = options.get("log_file") or os.path.join(
        options.get("state_dir", DEFAULT_STATE_DIR), LOG_NAME)
    guard = deadline.Guard(stage, timeout, log_path)
    guard.arm()
    deadline.ACTIVE = guard
    try:
        yield guard
    finally:
        deadline.ACTIVE = None
        guard.disarm()


def forward(args: list[str], stdin: Any, stdout: Any, stderr: Any,
            guard: deadline.Guard | None = None) -> int | None:
    """Exit status of the run the daemon did; None when the caller must run the hook itself."""
    parsed = parse_hook_args(args)
    if parsed is None:
        return None
    stage, options = parsed
    start_daemon = options.pop("start_daemon", False)
    timeout = hook_timeout(options)
    if timeout is None:
        return None  # argparse words the error
    started = time.monotonic() - deadline.process_age() if guard is None else guard.started

    def left() -> float:
        return timeout - (time.monotonic() - started)

    if guard is not None:
        guard.phase = "looking for the hook daemon"
    state_dir = options.get("state_dir", DEFAULT_STATE_DIR)
    path = os.path.join(state_dir, SOCKET_NAME)
    try:
        conn = connect(path, max(left(), 0.001))
        if conn is None and start_daemon:
            if guard is not None:
                guard.phase = "starting the hook daemon"
            conn = _start(path, state_dir, options, stage, left)
    except OSError as e:
        return _fail(stderr, stage, f"cannot reach the hook daemon at {path}: {e}", guard)
    if conn is None:
        return None
    # The daemon counts the time spent before it took the request, from this process's start.
    options["started"] = time.time() - (time.monotonic() - started)
    try:
        with conn:
            if guard is not None:
                guard.phase = "reading the OCI state on stdin"
            request = encode_request(stage, read_stdin(stdin), options)
            if guard is not None:
                guard.phase, guard.hint = ("waiting for the hook daemon's answer",
                                           deadline.DAEMON_HINT)
            conn.settimeout(max(left(), 0.001))
            conn.sendall(request)
            code, out, err = decode_reply(read_line(conn))
    except TimeoutError:
        return _fail(stderr, stage, f"no answer from the hook daemon at {path} within "
                                    f"{timeout:g} s (--timeout)", guard)
    except (OSError, ProtocolError) as e:
        return _fail(stderr, stage, f"the hook daemon at {path} failed before answering: {e}",
                     guard)
    stdout.write(out)
    stdout.flush()
    stderr.write(err)
    stderr.flush()
    return code


def _start(path: str, state_dir: str, options: dict[str, Any], stage: str,
           left: Callable[[], float]) -> socket.socket | None:
    """A connection to a daemon started on demand; None (the hook runs in process) when it
    cannot be started, with the reason in the hook log."""
    from nri_numa.hook import ondemand

    try:
        return ondemand.connect_or_start(path, state_dir, options, connect, left)
    except (ondemand.StartError, OSError) as e:
        log_path = options.get("log_file") or os.path.join(state_dir, LOG_NAME)
        deadline.log_line(log_path, stage, f"cannot start the hook daemon ({e}); running in "
                                           "process", level="WARNING")
        return None


def _fail(stderr: Any, stage: str, reason: str, guard: deadline.Guard | None = None) -> int:
    print(f"nri-numa hook {stage}: {reason}", file=stderr, flush=True)
    if guard is not None:  # the daemon never logged this run: crun drops stderr, the log keeps it
        deadline.log_line(guard.log_path, stage, f"{reason} ({guard.elapsed_ms():.0f} ms)")
    return 1


def main(args: list[str]) -> int | None:
    return forward(args, deadline.standard_input(), sys.stdout, sys.stderr, deadline.ACTIVE)
