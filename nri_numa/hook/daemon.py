"""``nri-numa hook-daemon``: the hook's engine, loaded once, serving hook runs over a socket.

A hook process spends most of its time starting Python and importing the engine. The daemon
pays that once; each hook's thin client then hands it the run (the wire: nri_numa.hook.client):
its arguments, read here with the parser of ``nri-numa hook`` (nri_numa.cli.hook.parse), and its
stdin, stdout and stderr. The daemon runs it with exactly the code an in-process hook runs
(``entry.run``), with the machine already loaded, and the ledger and cgroups of its last runs
kept (nri_numa.hook.daemon_cache: the checkpoint is read again only when it changed under the
daemon); ``--timeout`` counts from the start of the hook process. One run at a time, each as
soon as its request is in (nri_numa.hook.inbox).

A run whose --state-dir, --config or --topology is not what the daemon serves is refused with
one line: it would be answered from another ledger or machine. A request that is not a hook's
(no descriptors, too long, never finished) is dropped with a line in the daemon's log; no
request stops the daemon, and writing a run's output or its exit status is bounded in time
(REPLY_TIMEOUT_S), whoever holds the other end.
Each run still takes the checkpoint lock, so a hook that runs in process (no daemon yet, or one
that was just stopped) never writes the ledger at the same moment.

The socket is ``<state-dir>/hook.sock``, mode 0600: whoever may connect may place containers.
The daemon binds it itself, or takes it already listening (nri_numa.hook.activation) from
systemd's socket unit or from a hook that started the daemon on demand (nri_numa.hook.ondemand);
a socket handed over stays where it is when the daemon stops, as its owner left it.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nri_numa.cli import hook as hook_command
from nri_numa.cli.dispatch import error_line
from nri_numa.cli.errors import CliError
from nri_numa.hook import entry
from nri_numa.hook.activation import ActivationError, inherited_listener
from nri_numa.hook.client import SOCKET_NAME
from nri_numa.hook.daemon_cache import DaemonCache
from nri_numa.hook.inbox import Inbox, Request
from nri_numa.hook.machine import Machine, MachineError, load_machine, online_cpus
from nri_numa.hook.ondemand import StartError, bind_listener, take_start_lock
from nri_numa.safeio.bounds import LINE_LIMIT, one_line
from nri_numa.safeio.safe_files import UnusableFile, open_folder

REPLY_TIMEOUT_S = 2.0  # a hook reads its answer at once; one that does not has given up

log = logging.getLogger("nri_numa.hook.daemon")


class DaemonError(Exception):
    """The daemon cannot start; the message says why."""


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


def served_elsewhere(hook: entry.HookOptions, options: DaemonOptions) -> str | None:
    """Why the daemon must not run ``hook``: it asks for another state folder, configuration or
    topology, and would be answered from another ledger or machine. None when it may."""
    for what, asked, served in (("--state-dir", hook.state_dir, options.state_dir),
                                ("--config", hook.config_file, options.config_file),
                                ("--topology", hook.topology_file, options.topology_file)):
        if asked != served:
            return (f"the hook daemon at {options.socket_path} serves {what} "
                    f"{served or '(none)'}, this hook asks for {asked or '(none)'}; give both "
                    "the same")
    return None


def answer(args: list[str], stdin: IO[bytes], started: float, options: DaemonOptions,
           machine: MachineKeeper, cache: DaemonCache | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``nri-numa hook ARGS`` run here, as it would run in the
    hook's own process: argparse's help and errors included."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            parsed = hook_command.parse(args)
        hook = hook_command.hook_options(parsed, log_file=options.log_file)
    except SystemExit as e:  # argparse: help, or a usage error, on out or err
        code = e.code if isinstance(e.code, int) else 1
        return code, out.getvalue(), err.getvalue()
    except CliError as e:
        return 1, "", error_line("error", str(e)) + "\n"
    refusal = served_elsewhere(hook, options)
    if refusal is not None:
        prefix = f"nri-numa hook {hook.stage}: "
        line = prefix + one_line(refusal, LINE_LIMIT - len(prefix))
        log.warning("refused a hook: %s", line)
        return 1, "", line + "\n"
    code = entry.run(hook, stdin, out, err, machine=machine, started=started, cache=cache)
    return code, out.getvalue(), err.getvalue()


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
    cache = DaemonCache()  # the ledger and cgroups of its last runs
    log.info("hook daemon %d listening on %s%s", os.getpid(), options.socket_path,
             "" if inode is not None else " (socket handed over)")
    try:
        with Inbox(listener) as inbox:
            while not stopping.requested:
                with stopping.interruptible():
                    request = inbox.next()
                try:
                    _serve_one(request, options, machine, cache)
                finally:
                    request.close()
    except _Stop:
        pass
    finally:
        if inode is not None:
            _remove_socket(options.socket_path, inode)
        listener.close()
        log.info("hook daemon %d stopped", os.getpid())


def _serve_one(request: Request, options: DaemonOptions, machine: MachineKeeper,
               cache: DaemonCache) -> None:
    """Run one request, write its output to the hook's stdout and stderr, close them (the
    runtime reads those until every holder has), then send the exit status."""
    stdin, stdout, stderr = request.fds
    try:
        with open(stdin, "rb", closefd=False) as reader:
            code, out, err = answer(request.args, reader, request.started, options, machine,
                                    cache)
    except Exception:  # a bug: the daemon goes on serving
        log.exception("internal error while serving a hook")
        code, out, err = 1, "", "nri-numa hook: internal error in the hook daemon; see its log\n"
    try:
        with entry.time_limit(REPLY_TIMEOUT_S):
            for fd, text in ((stdout, out), (stderr, err)):
                _write_all(fd, text.encode("utf-8", "backslashreplace"))
    except (OSError, entry.HookTimeout) as e:
        log.warning("could not write a hook's output: %s", str(e) or "timed out")
    request.close_fds()
    try:
        request.conn.settimeout(REPLY_TIMEOUT_S)
        request.conn.sendall(bytes([code & 0xFF]))
    except OSError as e:  # the hook was killed (its runtime's timeout): it failed closed
        log.warning("could not answer a hook: %s", e)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
