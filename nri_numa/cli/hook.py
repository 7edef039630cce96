"""``nri-numa hook``: the OCI hook (runc, crun, podman, CRI-O) run at one stage.

The runtime starts this once per container and stage, so ``nri_numa.cli.main`` hands it to
``nri_numa.hook.client`` before argparse loads; this parser runs only when no hook daemon
answers."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from nri_numa.cli.errors import CliError

if TYPE_CHECKING:
    import argparse


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


def add_hook_input_options(p: argparse.ArgumentParser) -> None:
    """--config and --topology, one definition for the hook and its daemon, which must be
    given the same files."""
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (default: every policy none)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "once and keep it in the state folder)")


def plain_args(args: list[str]) -> SimpleNamespace | None:
    """``hook``'s arguments as its parser would give them (``command``, ``func`` and every
    option's dest), read without argparse: a stage and options as the hook client reads them
    (nri_numa.hook.client.parse_hook_args), no value starting with "-" (argparse may take such
    a value for an option) and every ``--timeout`` a finite number. None for anything else,
    which the parser judges (argparse, with the gettext, locale and shutil it loads)."""
    from nri_numa.hook.client import VALUE_OPTIONS, parse_hook_args

    parsed = parse_hook_args(args)
    if parsed is None:
        return None
    stage, options = parsed
    given = iter(args)
    for arg in given:  # every value given, one a later value replaces included
        name, eq, value = arg.partition("=")
        if name not in VALUE_OPTIONS:
            continue
        value = value if eq else next(given, "")
        if value.startswith("-") or (name == "--timeout" and not _finite(value)):
            return None
    values = {dest: options.get(dest) for dest in VALUE_OPTIONS.values()}
    if values["timeout"] is not None:
        values["timeout"] = float(values["timeout"])
    return SimpleNamespace(command="hook", stage=stage, **values,
                           start_daemon=bool(options.get("start_daemon", False)), func=cmd_hook)


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def cmd_hook(args: argparse.Namespace) -> int:
    """The stage in this process (no hook daemon answered), once it has a turn
    (nri_numa.hook.slots): under a burst the others sleep rather than all loading the engine at
    once, and give up at the deadline with the burst's reason."""
    import time

    from nri_numa.hook import deadline, slots
    from nri_numa.hook.client import DEFAULT_STATE_DIR, DEFAULT_TIMEOUT_S

    guard = deadline.ACTIVE
    started = deadline.process_started() if guard is None else guard.started
    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout

    def left() -> float:
        return timeout - (time.monotonic() - started)

    if guard is not None:
        guard.phase, guard.hint = "waiting for a turn to run in process", deadline.BURST_HINT
    # (No turn for a timeout argparse let through that HookOptions refuses below.)
    turn = slots.take_turn(args.state_dir or DEFAULT_STATE_DIR, left) if left() > 0 else None
    try:
        if turn is None and left() <= 0 and guard is not None:
            guard.give_up()
        if guard is not None:
            guard.phase = "loading nri-numa's hook"
        # Imported once the turn is held: even this much is slow when fifty hooks import it.
        from nri_numa.hook.entry import HookOptions, run

        given = {"state_dir": args.state_dir and Path(args.state_dir),
                 "config_file": args.config and Path(args.config),
                 "topology_file": args.topology and Path(args.topology),
                 "log_file": args.log_file and Path(args.log_file),
                 "timeout": args.timeout,
                 "cgroup_root": args.cgroup_root and Path(args.cgroup_root),
                 "proc_root": args.proc_root and Path(args.proc_root)}
        try:
            options = HookOptions(args.stage, **{k: v for k, v in given.items() if v is not None})
        except ValueError as e:
            raise CliError(str(e)) from None
        # run's own timer takes over from the guard, with the same deadline.
        return run(options, deadline.standard_input(), sys.stdout, sys.stderr, started=started,
                   timeout_hint=deadline.BURST_HINT)
    finally:
        slots.release(turn)
