"""The thin hook client: hand one hook run to the resident daemon (``nri-numa hook-daemon``).

Loading the engine costs a hook process far more than its work, so when a daemon listens on
``<state-dir>/hook.sock`` the hook process only forwards its stage, stdin and options and prints
the answer. Standard library only, and imported before anything else of nri_numa: every
millisecond here is paid by every container start.

When no daemon listens (no socket, or a socket nobody accepts on) the caller runs the hook in
process, as without a daemon. Once connected, the daemon's answer is final, and a daemon that
dies or stalls before answering fails the hook closed: it may have placed the container already,
so running the stage again here could not be trusted to agree with it.

Wire format: one JSON line each way. Request ``{"stage", "stdin", "options"}`` (stdin decoded
with surrogateescape, so any bytes survive); reply ``{"exit", "stdout", "stderr"}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

SOCKET_NAME = "hook.sock"
DEFAULT_STATE_DIR = "/run/nri-numa"  # as nri_numa.hook.entry.DEFAULT_STATE_DIR
DEFAULT_TIMEOUT_S = 4.0  # as nri_numa.hook.entry.DEFAULT_TIMEOUT_S
MAX_LINE = 64 << 20  # an OCI spec is a few KiB; this only stops a runaway peer
STAGES = ("createRuntime", "prestart", "poststop", "precreate")
# The hook's options with a value (nri_numa.cli.hook.add_parser), as the daemon's request keys.
VALUE_OPTIONS = {"--state-dir": "state_dir", "--config": "config", "--topology": "topology",
                 "--log-file": "log_file", "--timeout": "timeout",
                 "--cgroup-root": "cgroup_root", "--proc-root": "proc_root"}


class ProtocolError(Exception):
    """A request or reply line that is not what the other side must send."""


def parse_hook_args(args: list[str]) -> tuple[str, dict[str, str]] | None:
    """(stage, options) from ``hook``'s arguments; None for anything argparse must judge
    (help, a bad stage, an unknown or incomplete option)."""
    stage: str | None = None
    options: dict[str, str] = {}
    rest = iter(args)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
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


def forward(args: list[str], stdin: Any, stdout: Any, stderr: Any) -> int | None:
    """Exit status of the run the daemon did; None when the caller must run the hook itself."""
    started = time.time()
    parsed = parse_hook_args(args)
    if parsed is None:
        return None
    stage, options = parsed
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError:
        return None  # argparse words the error
    if not timeout > 0:
        return None
    path = os.path.join(options.get("state_dir", DEFAULT_STATE_DIR), SOCKET_NAME)
    try:
        conn = connect(path, timeout)
    except OSError as e:
        return _fail(stderr, stage, f"cannot reach the hook daemon at {path}: {e}")
    if conn is None:
        return None
    options["started"] = started  # the daemon counts the time spent before it took the request
    try:
        with conn:
            conn.sendall(encode_request(stage, stdin.read(), options))
            code, out, err = decode_reply(read_line(conn))
    except TimeoutError:
        return _fail(stderr, stage, f"no answer from the hook daemon at {path} within "
                                    f"{timeout:g} s (--timeout)")
    except (OSError, ProtocolError) as e:
        return _fail(stderr, stage, f"the hook daemon at {path} failed before answering: {e}")
    stdout.write(out)
    stdout.flush()
    stderr.write(err)
    stderr.flush()
    return code


def _fail(stderr: Any, stage: str, reason: str) -> int:
    print(f"nri-numa hook {stage}: {reason}", file=stderr, flush=True)
    return 1


def main(args: list[str]) -> int | None:
    return forward(args, sys.stdin.buffer, sys.stdout, sys.stderr)
