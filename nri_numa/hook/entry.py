"""One hook run, from stdin to exit status (``nri-numa hook STAGE``).

Fail closed: a refusal or any failure exits 1 with one line on stderr, which runc and podman (with
runc) put in their error; crun drops a hook's stderr, so the same line also goes to the log
file. The run never outlasts ``--timeout``: waiting for the lock stops short of it, and a timer
ends anything else that hangs (the runtime would otherwise kill the hook at the hooks.d
``timeout`` without a word). Set ``--timeout`` a second or so below that value.

``run`` is also what ``nri-numa hook-daemon`` runs for each forwarded hook (nri_numa.hook.daemon),
with the machine kept loaded. Either way the timeout counts from when the hook process started
(nri_numa.hook.deadline): the runtime's clock does.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from nri_numa.agent.logs import OneLineFormatter, open_log_file
from nri_numa.hook import client
from nri_numa.hook.cgroup import DEFAULT_CGROUP_ROOT, DEFAULT_PROC, CgroupFs
from nri_numa.hook.deadline import (DAEMON_HINT, DEFAULT_TIMEOUT_S, LOG_NAME, check_timeout,
                                    gave_up, gave_up_early)
from nri_numa.hook.oci import HookInputError, parse_spec, parse_state, read_input, read_spec
from nri_numa.safeio.bounds import LINE_LIMIT, one_line, quote
from nri_numa.safeio.log_files import LogFileRefused, LogSetupError

STAGES = {"createRuntime": "createRuntime", "prestart": "createRuntime",
          "poststop": "poststop", "precreate": "precreate"}
DEFAULT_STATE_DIR = Path(client.DEFAULT_STATE_DIR)
LOG_KEEP_BYTES = 1 << 20  # then the log moves to hook.log.1 (one old file is kept)
# One line per event, escaped as the agent's text log is (OneLineFormatter): a newline or a
# control character in a logged value can neither start a forged line nor fail the write.
LOG_FORMAT = "%(asctime)s %(levelname)s hook[%(process)d] %(message)s"
_LOCK_MARGIN_S = 0.5  # left, after waiting for the lock, for the transaction itself
# A ledger set aside (damaged, or not this machine's): nothing else knows what the hook placed.
REBUILT = ("the hook starts from an empty ledger, so the CPUs of containers it placed before "
           "count as free")

if TYPE_CHECKING:
    from nri_numa.hook.machine import Machine
    from nri_numa.hook.daemon_cache import DaemonCache

    # How a run gets its machine: the hook process loads it, the daemon keeps it loaded.
    MachineSource = Callable[["HookOptions"], Machine]

log = logging.getLogger("nri_numa.hook")


class HookTimeout(Exception):
    pass


@dataclass(frozen=True, slots=True)
class HookOptions:
    stage: str  # a key of STAGES
    state_dir: Path = DEFAULT_STATE_DIR
    config_file: Path | None = None
    topology_file: Path | None = None
    log_file: Path | None = None  # default: <state_dir>/hook.log
    timeout: float = DEFAULT_TIMEOUT_S
    cgroup_root: Path = DEFAULT_CGROUP_ROOT
    proc_root: Path = DEFAULT_PROC

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage {quote(self.stage)} is not one of {', '.join(STAGES)}")
        check_timeout(self.timeout)

    @property
    def log_path(self) -> Path:
        return self.log_file or self.state_dir / LOG_NAME


def run(options: HookOptions, stdin: IO[bytes], stdout: IO[str], stderr: IO[str],
        machine: MachineSource | None = None, started: float | None = None,
        timeout_hint: str = "", cache: DaemonCache | None = None) -> int:
    """Exit status 0 when the stage did its work, 1 (and the reason on stderr) otherwise.

    ``machine`` defaults to loading it from the options; ``started`` (a ``time.monotonic()``
    value, default now) is when the run began, which the timeout counts from. ``timeout_hint``
    (a hook running in process): a give-up says what the run was doing, and where that was a
    burst's doing (loading the engine, the state lock), what helps. ``cache``: what the hook
    daemon keeps between runs (nri_numa.hook.daemon_cache)."""
    started = time.monotonic() if started is None else started
    handler = _log_to_file(options, stderr)
    left = options.timeout - (time.monotonic() - started)
    phase = _Phase()
    try:
        if left <= 0:  # spent before the run began: queued in the hook daemon, where no hint is
            return _fail(options, stderr, gave_up(options.timeout, "waiting to be run",
                                                  timeout_hint or DAEMON_HINT), started)
        with time_limit(left):
            try:
                done = _run_stage(options, stdin, stdout, started, machine or load_machine,
                                  phase, cache)
            except HookTimeout:
                return _fail(options, stderr, phase.gave_up(options.timeout, timeout_hint),
                             started)
            except Exception as e:  # fail closed on anything, with a reason
                if timeout_hint and _is_lock_timeout(e):
                    return _fail(options, stderr, gave_up_early(
                        options.timeout, f"waiting for the state lock ({e})", timeout_hint),
                        started)
                return _fail(options, stderr, _reason(e), started)
        log.info("%s: %s (%.0f ms)", options.stage, done, (time.monotonic() - started) * 1000)
        return 0
    finally:
        package = logging.getLogger("nri_numa")
        package.removeHandler(handler)
        handler.close()


def load_machine(options: HookOptions) -> Machine:
    from nri_numa.hook.machine import load_machine as load

    return load(options.state_dir, options.config_file, options.topology_file)


class _Phase:
    """What a run is doing, for the line it gives up with."""

    # Where a burst of hooks in process spends its time: the hint applies there only (a
    # runtime that never closes stdin, say, is not helped by the hook daemon).
    BURST = ("loading the engine", "loading the machine")

    def __init__(self) -> None:
        self.now = "loading the engine"

    def gave_up(self, timeout: float, hint: str) -> str:
        return gave_up(timeout, self.now, hint if self.now in self.BURST else "")


def _run_stage(options: HookOptions, stdin: IO[bytes], stdout: IO[str], started: float,
               machine_source: MachineSource, phase: _Phase | None = None,
               cache: DaemonCache | None = None) -> str:
    phase = phase or _Phase()
    from nri_numa.hook import stages
    from nri_numa.state.checkpoint import CheckpointStore

    phase.now = "reading the OCI state on stdin"
    raw = read_input(stdin)
    stage = STAGES[options.stage]
    state = spec = None
    if stage == "precreate":
        spec = parse_spec(raw, "the spec on stdin")
    else:
        state = parse_state(raw)
        if stage == "createRuntime":
            spec = read_spec(state.bundle)
    phase.now = "loading the machine"
    machine = machine_source(options)
    phase.now = f"running {stage}"
    left = options.timeout - (time.monotonic() - started) - _LOCK_MARGIN_S
    store = CheckpointStore(options.state_dir, machine.fingerprint, rebuilt=REBUILT)
    env = stages.HookEnv(machine, store,
                         CgroupFs(options.cgroup_root, options.proc_root), max(left, 0.0),
                         cache=cache)
    if stage == "createRuntime":
        return stages.create_runtime(env, state, spec)
    if stage == "poststop":
        return stages.poststop(env, state)
    placed, done = stages.precreate(env, spec)
    stdout.write(json.dumps(placed))
    stdout.flush()
    return done


def _fail(options: HookOptions, stderr: IO[str], reason: str,
          started: float | None = None) -> int:
    # One line of bounded length, whatever the message held: the runtime shows it whole.
    line = one_line(reason, LINE_LIMIT - len(f"nri-numa hook {options.stage}: "))
    if started is None:
        log.error("%s: %s", options.stage, line)
    else:  # the log line also says how long the run took, as a successful run's does
        log.error("%s: %s (%.0f ms)", options.stage, line, (time.monotonic() - started) * 1000)
    print(f"nri-numa hook {options.stage}: {line}", file=stderr, flush=True)
    return 1


def _is_lock_timeout(e: Exception) -> bool:
    from nri_numa.hook.stages import LockTimeout  # loaded already: the stage raised it

    return isinstance(e, LockTimeout)


def _reason(e: Exception) -> str:
    from nri_numa.hook.machine import MachineError
    from nri_numa.hook.stages import HookError

    if isinstance(e, (HookError, HookInputError, MachineError)):
        return str(e)
    log.exception("unexpected failure")
    return f"internal error ({type(e).__name__}: {one_line(str(e), 200)}); see the hook log"


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise HookTimeout in the main thread once ``seconds`` have passed."""
    def expire(signum: int, frame: Any) -> None:
        raise HookTimeout()

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread, which alone takes signals
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _log_to_file(options: HookOptions, stderr: IO[str] | None = None) -> logging.Handler:
    """A handler on the package's logger, so that the run's lines and those of the state layer
    at INFO and above go to the hook log (``--log-file``, default <state-dir>/hook.log; mode
    0600, moved to hook.log.1 past LOG_KEEP_BYTES), in LOG_FORMAT. A log that cannot be opened
    or written must not stop the hook, whose stderr still carries every failure: its lines are
    dropped. A
    log or folder that is a symlink, or a log that is not a file, is never written through nor
    waited on (nri_numa.safeio.log_files): one warning line on stderr says so."""
    try:
        handler = open_log_file(options.log_path, create_folder=True, rotate_past=LOG_KEEP_BYTES,
                                quiet=True)
    except LogFileRefused as e:
        # A state folder that is a link fails the run itself, with that reason: one line.
        if stderr is not None and not (e.folder and options.log_file is None):
            print(f"nri-numa hook {options.stage}: warning: {e}", file=stderr, flush=True)
        handler = logging.NullHandler()
    except LogSetupError:
        # Not none at all: logging's last resort would then print each line to stderr too,
        # beside the one line the run fails with.
        handler = logging.NullHandler()
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    package = logging.getLogger("nri_numa")
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    return handler
