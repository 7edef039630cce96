"""``nri-numa hook``: the OCI hook (runc, crun, podman, CRI-O) run at one stage.

The runtime starts this once per container and stage, so ``nri_numa.cli.main`` hands it to
``nri_numa.hook.client`` before argparse loads; this parser runs only when no hook daemon
answers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nri_numa.cli.errors import CliError


def add_parser(sub: argparse._SubParsersAction) -> None:
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
                   help="give up (and fail) after this long; keep it below the runtime's hook "
                        "timeout (default 4)")
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


def cmd_hook(args: argparse.Namespace) -> int:
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
    return run(options, sys.stdin.buffer, sys.stdout, sys.stderr)
