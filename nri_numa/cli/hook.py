"""``nri-numa hook``: the OCI hook (runc, crun, podman, CRI-O) run at one stage.

The runtime starts this once per container and stage, through the thin client
(nri_numa.hook.client) when no hook daemon took the run, or directly. Its arguments are read by
this module's parser alone (``parse``), here and in the hook daemon for every run it is handed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nri_numa.cli.errors import CliError

if TYPE_CHECKING:
    import argparse
    import _socket

    from nri_numa.hook.deadline import Guard
    from nri_numa.hook.entry import HookOptions


def add_parser(sub: argparse._SubParsersAction) -> None:
    import argparse

    # Defaults live in nri_numa.hook.entry.HookOptions, loaded only when a hook runs; the help
    # texts repeat them and a test keeps the two in step.
    p = sub.add_parser("hook", help="run as an OCI hook (runc/crun config.json, podman and "
                                    "CRI-O hooks.d)",
                       description="Run by the container runtime at a hook stage. "
                                   "createRuntime (or its alias prestart): read the OCI state on "
                                   "stdin, place the container and write its cgroup's cpuset. "
                                   "poststop: release it. precreate (podman): read the spec on "
                                   "stdin and print it with the placement in it. Exits 1 with "
                                   "one line on stderr when it refuses or fails (docs/oci-hook.md).")
    p.add_argument("stage", choices=("createRuntime", "prestart", "poststop", "precreate"))
    p.add_argument("--state-dir", metavar="DIR",
                   help="the ledger all hook processes share (default /run/nri-numa)")
    add_hook_input_options(p)
    p.add_argument("--log-file", metavar="FILE",
                   help="where each run is logged (default <state-dir>/hook.log)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="give up (and fail) this long after the hook process started; keep it "
                        "below the runtime's hook timeout (default 4)")
    p.add_argument("--start-daemon", action="store_true",
                   help="when no hook daemon listens on <state-dir>/hook.sock, start one "
                        "(detached) and hand it this run, rather than loading the engine in this "
                        "process: the setup without systemd that holds under a burst of "
                        "container starts (docs/oci-hook.md)")
    p.add_argument("--cgroup-root", metavar="DIR", help=argparse.SUPPRESS)  # tests: fake trees
    p.add_argument("--proc-root", metavar="DIR", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_hook)


def parse(given: list[str]) -> argparse.Namespace:
    """``nri-numa hook GIVEN`` read by the hook's parser alone (argparse's SystemExit for help
    and errors, its lines on sys.stdout and sys.stderr); ``given`` kept, for the hook daemon."""
    from nri_numa.cli.dispatch import build_parser

    args = build_parser((sys.modules[__name__],)).parse_args(["hook", *given])
    args.given = given
    return args


def add_hook_input_options(p: argparse.ArgumentParser) -> None:
    """--config and --topology, one definition for the hook and its daemon, which must be
    given the same files."""
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (default: every policy none)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "once and keep it in the state folder)")


def hook_options(args: argparse.Namespace, **defaults: Any) -> HookOptions:
    """The run ``hook``'s parsed arguments ask for; ``defaults`` for options not given.
    CliError, one line, for a value no run can take (a timeout past a day)."""
    from nri_numa.hook.entry import HookOptions

    given = {"state_dir": args.state_dir and Path(args.state_dir),
             "config_file": args.config and Path(args.config),
             "topology_file": args.topology and Path(args.topology),
             "log_file": args.log_file and Path(args.log_file),
             "timeout": args.timeout,
             "cgroup_root": args.cgroup_root and Path(args.cgroup_root),
             "proc_root": args.proc_root and Path(args.proc_root)}
    try:
        return HookOptions(args.stage, **{**defaults, **{k: v for k, v in given.items()
                                                         if v is not None}})
    except ValueError as e:
        raise CliError(str(e)) from None


def cmd_hook(args: argparse.Namespace) -> int:
    """The run, handed to the hook daemon when one listens on <state-dir>/hook.sock (started
    here with --start-daemon), else done in this process once it has a turn
    (nri_numa.hook.turns): under a burst the others sleep rather than all loading the engine at
    once, and give up at the deadline with the burst's reason. The deadline guard covers it all
    until the stage's own timer takes over; the engine is imported only once the turn is held."""
    import os

    from nri_numa.hook import client, deadline

    timeout = deadline.DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    try:
        deadline.check_timeout(timeout)
    except ValueError as e:
        raise CliError(str(e)) from None
    state_dir = args.state_dir or client.DEFAULT_STATE_DIR
    guard = deadline.Guard(args.stage, timeout,
                           args.log_file or os.path.join(state_dir, deadline.LOG_NAME))
    guard.arm()
    try:
        code = _hand_over(args, state_dir, guard)
        return _run_here(args, guard) if code is None else code
    finally:
        guard.disarm()


def _hand_over(args: argparse.Namespace, state_dir: str, guard: Guard) -> int | None:
    """The exit status of the run a daemon did; None when none takes it."""
    import os

    from nri_numa.hook import client, deadline

    if not client.standard_fds_open():  # nothing to hand over: the run stays here
        return None
    path = os.path.join(state_dir, client.SOCKET_NAME)
    guard.phase = "looking for the hook daemon"
    try:
        conn = client.connect(path)
        if conn is None and args.start_daemon:
            guard.phase = "starting the hook daemon"
            conn = _start_daemon(args, state_dir, path, guard)
    except OSError as e:
        return _fail(guard, client.unreachable(path, e))
    if conn is None:
        return None
    guard.phase, guard.hint = "waiting for the hook daemon's answer", deadline.DAEMON_HINT
    try:
        code = client.hand_over(conn, args.given)
    except OSError as e:
        return _fail(guard, client.unanswered(path, e))
    return _fail(guard, client.unanswered(path)) if code is None else code


def _start_daemon(args: argparse.Namespace, state_dir: str, path: str,
                  guard: Guard) -> _socket.socket | None:
    """A connection to a daemon started here; None (the run stays here) when it cannot be
    started, with the reason in the hook log."""
    from nri_numa.hook import client, deadline, ondemand

    given = {"config": args.config, "topology": args.topology, "log_file": args.log_file}
    try:
        return ondemand.connect_or_start(path, state_dir, given, client.connect,
                                         lambda: guard.left)
    except (ondemand.StartError, OSError) as e:
        deadline.log_line(guard.log_path, guard.stage,
                          f"cannot start the hook daemon ({e}); running in process",
                          level="WARNING")
        return None


def _fail(guard: Guard, reason: str) -> int:
    from nri_numa.hook.deadline import log_line

    print(f"nri-numa hook {guard.stage}: {reason}", file=sys.stderr, flush=True)
    # crun drops a hook's stderr: the log keeps the line (the daemon never logged this run).
    log_line(guard.log_path, guard.stage, f"{reason} ({guard.elapsed_ms():.0f} ms)")
    return 1


def _run_here(args: argparse.Namespace, guard: Guard) -> int:
    from nri_numa.hook import client, deadline, turns

    guard.phase, guard.hint = "waiting for a turn to run in process", deadline.BURST_HINT
    turn = turns.take_turn(args.state_dir or client.DEFAULT_STATE_DIR, lambda: guard.left)
    try:
        if turn is None and guard.left <= 0:
            guard.give_up()
        guard.phase = "loading nri-numa's hook"
        # Imported once the turn is held: even this much is slow when fifty hooks import it.
        from nri_numa.hook.entry import run

        # run's own timer takes over from the guard, with the same deadline.
        return run(hook_options(args), deadline.standard_input(), sys.stdout, sys.stderr,
                   started=guard.started, timeout_hint=deadline.BURST_HINT)
    finally:
        turns.release(turn)
