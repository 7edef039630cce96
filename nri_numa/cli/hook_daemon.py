"""``nri-numa hook-daemon``: the hook's machine, configuration and engine kept loaded."""

from __future__ import annotations

import argparse
from pathlib import Path

from nri_numa.cli.errors import CliError
from nri_numa.cli.hook import add_hook_input_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hook-daemon", help="serve `nri-numa hook` runs from one loaded process",
                       description="Load the machine, configuration and engine once and run "
                                   "every `nri-numa hook` that names the same --state-dir, one at "
                                   "a time, over <state-dir>/hook.sock (mode 0600). Hooks fall "
                                   "back to running in process while no daemon listens. Give it "
                                   "the --config and --topology the hooks are given.")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the hooks' state folder, which holds the socket (default /run/nri-numa)")
    add_hook_input_options(p)
    p.add_argument("--log-file", metavar="FILE",
                   help="where the daemon and each run log (default <state-dir>/hook.log)")
    p.set_defaults(func=cmd_hook_daemon)


def cmd_hook_daemon(args: argparse.Namespace) -> int:
    from nri_numa.hook.daemon import DaemonError, DaemonOptions, serve

    given = {"state_dir": args.state_dir and Path(args.state_dir),
             "config_file": args.config and Path(args.config),
             "topology_file": args.topology and Path(args.topology),
             "log_file": args.log_file and Path(args.log_file)}
    try:
        serve(DaemonOptions(**{k: v for k, v in given.items() if v is not None}))
    except DaemonError as e:
        raise CliError(str(e)) from None
    return 0
