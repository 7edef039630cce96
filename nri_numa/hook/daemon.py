"""``nri-numa hook-daemon``: the hook's engine, loaded once, serving hook runs over a socket.

A hook process spends most of its time starting Python and importing the engine. The daemon
pays that once; each ``nri-numa hook`` then forwards its run (nri_numa.hook.client) and the
daemon runs it with exactly the code an in-process hook runs (``entry.run``), with the machine
already loaded, and the ledger and cgroups of its last runs kept (nri_numa.hook.memory: the
checkpoint is read again only when it changed under the daemon). One run at a time, each as
soon as its request is in (nri_numa.hook.inbox).
Each run still takes the checkpoint lock, so a hook that runs in process (no daemon yet, or one
that was just stopped) never writes the ledger at the same moment.

The socket is ``<state-dir>/hook.sock``, mode 0600: whoever may connect may place containers.
The daemon binds it itself, or takes it already listening (nri_numa.hook.activation) from
systemd's socket unit or from a hook that started the daemon on demand (nri_numa.hook.ondemand);
a socket handed over stays where it is when the daemon stops, as its owner left it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.hook import entry
from nri_numa.hook.activation import ActivationError, inherited_listener
from nri_numa.hook.client import SOCKET_NAME
from nri_numa.hook.inbox import Inbox
from nri_numa.hook.machine import Machine, MachineError, load_machine, online_cpus
from nri_numa.hook.memory import DaemonMemory
from nri_numa.hook.ondemand import StartError, bind_listener, take_start_lock
from nri_numa.safeio.safe_files import UnusableFile, open_folder

REPLY_TIMEOUT_S = 2.0  # a hook reads its answer at once; one that does not has given up

log = logging.getLogger("nri_numa.hook.daemon")


class DaemonError(Exception):
    """The daemon cannot start; the message says why."""


class BadRequest(Exception):
    pass


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    state_dir: Path = entry.DEFAULT_STATE_DIR
    config_file: Path | None = None
    topology_file: Path | None = None
    log_file: Path | None = None  # default: <state_dir>/hook.log, as the hook's

    @property
    def socket_path(self) -> Path:
        return self.state_dir / SOCKET_NAME


class MachineKeeper:
    """The loaded machine, reloaded only when a discovered topology's CPUs went on/offline.

    ``lazy``: a machine that cannot be loaded at start is tried again at each run, which fails
    with the reason until it loads. A daemon whose socket was handed over takes that course:
    hooks already wait on the socket, and exiting would only answer them with a closed
    connection (and have systemd or the next hook start it again, to fail the same way)."""

    def __init__(self, options: DaemonOptions, lazy: bool = False) -> None:
        self.options = options
        self.machine: Machine | None = None
        try:
            self.machine = self._load()
        except MachineError as e:
            if not lazy:
                raise
            log.error("cannot load the machine; each hook run fails with this until it loads: "
                      "%s", e)

    def __call__(self, hook: entry.HookOptions) -> Machine:
        # A hook configured differently from the daemon would get another machine's answer.
        for what, asked, served in (("--config", hook.config_file, self.options.config_file),
                                    ("--topology", hook.topology_file,
                                     self.options.topology_file)):
            if asked != served:
                raise MachineError(f"the hook daemon serves {what} {served or '(none)'}, this "
                                   f"hook asks for {asked or '(none)'}; give both the same")
        if self.machine is None:
            self.machine = self._load()
        elif self.options.topology_file is None \
                and online_cpus() not in (None, self.machine.topology.online_cpus):
            log.info("the online CPUs changed: loading the machine again")
            self.machine = self._load()
        return self.machine

    def _load(self) -> Machine:
        o = self.options
        return load_machine(o.state_dir, o.config_file, o.topology_file)


def decode_request(line: bytes, options: DaemonOptions) -> tuple[entry.HookOptions, bytes, float]:
    """The hook's options, its stdin and when it started (``time.monotonic()`` here).
    BadRequest, one line, for anything else: a request must never stop the daemon, so its
    nesting and numbers are bounded before it is parsed (nri_numa.safeio.documents) and every value
    is checked for its type and range."""
    from nri_numa.safeio.bounds import one_line, quote
    from nri_numa.safeio.documents import DocumentError, load_json

    try:
        request = load_json(line, "request")
    except DocumentError as e:
        raise BadRequest(str(e)) from None
    if not isinstance(request, dict):
        raise BadRequest("not a JSON object")
    stage, stdin, given = request.get("stage"), request.get("stdin"), request.get("options")
    if not isinstance(stage, str) or not isinstance(stdin, str) or not isinstance(given, dict):
        raise BadRequest("stage, stdin and options must be a string, a string and an object")
    kwargs: dict[str, Any] = {"state_dir": options.state_dir}
    for key, name in (("config", "config_file"), ("topology", "topology_file"),
                      ("log_file", "log_file"), ("cgroup_root", "cgroup_root"),
                      ("proc_root", "proc_root")):
        value = given.get(key)
        if value is not None and (not isinstance(value, str) or "\0" in value
                                  or len(value) > _MAX_PATH):
            raise BadRequest(f"options.{key} must be a path, not {quote(value)}")
        if value is not None:
            kwargs[name] = Path(value)
    kwargs.setdefault("log_file", options.log_file)
    try:
        if "timeout" in given:
            kwargs["timeout"] = _seconds(given["timeout"], "options.timeout")
        hook = entry.HookOptions(stage, **kwargs)
        started = _seconds(given.get("started", time.time()), "options.started")
        waited = max(time.time() - started, 0.0)
        # The client sends its stdin decoded with surrogateescape; any other lone surrogate
        # (only a forged request has one) cannot be encoded back.
        raw = stdin.encode("utf-8", "surrogateescape")
    except (TypeError, ValueError) as e:
        raise BadRequest(one_line(str(e), 200)) from None
    return hook, raw, time.monotonic() - waited


_MAX_PATH = 4096  # Linux's PATH_MAX


def _seconds(value: Any, where: str) -> float:
    """A finite number: float() takes "inf" and "nan", which no timer can be armed with."""
    import math

    from nri_numa.safeio.bounds import quote

    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: could not convert {quote(value)} to a number")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{where}: could not convert {quote(value)} to a number") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{where} must be a finite number, not {quote(value)}")
    return seconds


def answer(line: bytes, options: DaemonOptions, machine: MachineKeeper,
           memory: DaemonMemory | None = None) -> dict[str, Any]:
    try:
        hook, stdin, started = decode_request(line, options)
    except BadRequest as e:
        log.warning("bad request: %s", e)
        return {"exit": 1, "stdout": "", "stderr": f"nri-numa hook: bad request to the hook "
                                                   f"daemon: {e}\n"}
    out, err = io.StringIO(), io.StringIO()
    code = entry.run(hook, io.BytesIO(stdin), out, err, machine=machine, started=started,
                     memory=memory)
    return {"exit": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve(options: DaemonOptions) -> None:
    """Serve until SIGTERM or SIGINT; a run under way is finished first."""
    # Handlers first: a SIGTERM while the daemon starts up ends it cleanly, not by default action.
    stopping = _StopFlag()
    _log_to(options.log_file or options.state_dir / entry.LOG_NAME)
    try:
        listener = inherited_listener(options.socket_path)
    except ActivationError as e:
        raise DaemonError(str(e)) from None
    try:
        machine = MachineKeeper(options, lazy=listener is not None)
    except MachineError as e:
        raise DaemonError(str(e)) from None
    if stopping.requested:
        return
    inode: int | None = None  # a socket handed over is its owner's to remove
    if listener is None:
        listener = _listen(options.socket_path)
        inode = options.socket_path.stat().st_ino
    memory = DaemonMemory()  # the ledger and cgroups of its last runs (nri_numa.hook.memory)
    log.info("hook daemon %d listening on %s%s", os.getpid(), options.socket_path,
             "" if inode is not None else " (socket handed over)")
    try:
        with Inbox(listener) as inbox:
            while not stopping.requested:
                with stopping.interruptible():
                    conn, line = inbox.next()
                with conn:
                    _serve_one(conn, line, options, machine, memory)
    except _Stop:
        pass
    finally:
        if inode is not None:
            _remove_socket(options.socket_path, inode)
        listener.close()
        log.info("hook daemon %d stopped", os.getpid())


def _serve_one(conn: socket.socket, line: bytes, options: DaemonOptions,
               machine: MachineKeeper, memory: DaemonMemory) -> None:
    reply = json.dumps(answer(line, options, machine, memory)).encode() + b"\n"
    try:
        conn.settimeout(REPLY_TIMEOUT_S)
        conn.sendall(reply)
    except OSError as e:  # the hook gave up (its timeout) or was killed: it failed closed
        log.warning("could not answer a hook: %s", e)


def _listen(path: Path) -> socket.socket:
    _state_folder(path.parent)
    try:
        # The lock a hook starting a daemon on demand holds while it binds: never both at once.
        lock = take_start_lock(str(path.parent))
    except OSError as e:
        raise DaemonError(f"cannot create {path.parent} or its start lock: {e.strerror}") \
            from None
    try:
        _clear_stale(path)
        return bind_listener(str(path))
    except StartError as e:
        raise DaemonError(str(e)) from None
    except OSError as e:
        raise DaemonError(f"cannot listen on {path}: {e.strerror}") from None
    finally:
        os.close(lock)


def _state_folder(folder: Path) -> None:
    """Make the socket's folder if missing, and refuse one that is a symlink: the socket and
    its start lock would be made wherever it points."""
    try:
        fd = open_folder(folder, create=True)
    except UnusableFile as e:
        raise DaemonError(f"state folder {e}") from None
    os.close(fd)


def _clear_stale(path: Path) -> None:
    """Remove a socket left by a daemon that died; refuse when one still answers on it."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise DaemonError(f"{path} exists and is not a socket; remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink(missing_ok=True)
        return
    except OSError as e:
        raise DaemonError(f"cannot check {path}: {e.strerror}") from None
    finally:
        probe.close()
    raise DaemonError(f"another hook daemon listens on {path}")


def _remove_socket(path: Path, inode: int) -> None:
    """Unlink the socket unless another daemon has bound a new one there since."""
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except OSError:
        pass


class _Stop(Exception):
    pass


class _StopFlag:
    """SIGTERM/SIGINT end the daemon at once while it waits, after the run while it works."""

    def __init__(self) -> None:
        self.requested = False
        self._waiting = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self._waiting:
            raise _Stop()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        self._waiting = True
        try:
            if self.requested:
                raise _Stop()
            yield
        finally:
            self._waiting = False


def _log_to(path: Path) -> None:
    # Opened as the hook opens it (nri_numa.agent.logs.open_log_file): never through a
    # symlink, never waiting on a FIFO, which would hang the daemon before it listens. Rotated
    # as the hook rotates it: once a hook run has moved the file to hook.log.1 under the
    # daemon, the daemon's next line past the size opens hook.log again.
    from nri_numa.agent.logs import open_log_file
    from nri_numa.safeio.log_files import LogFileRefused, LogSetupError

    refused = None
    try:
        handler = open_log_file(path, create_folder=True, rotate_past=entry.LOG_KEEP_BYTES)
    except LogFileRefused as e:
        handler, refused = logging.StreamHandler(), e
    except LogSetupError:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s hook-daemon[%(process)d] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # the runs log through entry's handler; this one is the daemon's
    if refused is not None:
        log.warning("%s; logging to standard error", refused)
