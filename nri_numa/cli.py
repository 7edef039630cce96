"""``nri-numa``: the command line. Each subcommand is a small function over the library."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa import __version__

if TYPE_CHECKING:  # the engine loads only for the subcommands that use it
    from nri_numa.engine.context import EngineContext
    from nri_numa.simulate import Entry, Step


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def _load_topology(args: argparse.Namespace):
    from nri_numa.inputs import InputFileError, read_topology_file
    from nri_numa.topology import discover

    if args.preset:
        return _preset(args.preset)
    if args.topology:
        try:
            return read_topology_file(Path(args.topology))
        except InputFileError as e:
            raise CliError(str(e)) from None
    root = Path(args.root)
    if not (root / "sys").is_dir():
        raise CliError(f"{root} has no sys/ folder: --root takes the folder that holds sys/")
    return discover(root, nvml=not args.no_nvml)


def _preset(name: str):
    from nri_numa.topology.synthetic import preset_topology

    try:
        return preset_topology(name)
    except KeyError as e:
        raise CliError(e.args[0] if e.args else f"unknown preset {name!r}") from None


def cmd_topology(args: argparse.Namespace) -> int:
    from nri_numa.topology.render import render_table, render_tree

    topology = _load_topology(args)
    if args.format == "json":
        print(topology.to_json())
    elif args.format == "tree":
        print(render_tree(topology))
    else:
        print(render_table(topology))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from nri_numa.topology.synthetic import write_tree

    topology = _load_topology(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise CliError(f"{out} exists and is not empty; give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    write_tree(topology, out)
    print(f"wrote a sysfs tree of {len(topology.cpus)} CPUs, {len(topology.numa_nodes)} NUMA nodes, "
          f"{len(topology.gpus)} GPUs to {out}; read it with: nri-numa topology --root {out}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from nri_numa.topology.synthetic import PRESETS

    width = max(len(name) for name in PRESETS)
    for name, preset in PRESETS.items():
        print(f"{name.ljust(width)}  {preset.summary}")
    return 0


def _engine_inputs(args: argparse.Namespace) -> tuple[EngineContext, list[Entry]]:
    """The engine context (machine + config) and the pods file's entries."""
    from nri_numa.simulate import InputError, build_context, load_config, load_pods

    topology = _load_topology(args)
    try:
        config = load_config(Path(args.config))
        ctx = build_context(topology, config, Path(args.config))
        return ctx, load_pods(Path(args.pods))
    except InputError as e:
        raise CliError(str(e)) from None


def _report_bad_entries(pods_file: str, steps: Sequence[Step]) -> int:
    """One error line per bad entry of the pods file; the exit status they call for."""
    for step in steps:
        print(f"nri-numa: error: {pods_file} {step.where}: {step.message}", file=sys.stderr)
    return 1 if steps else 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from nri_numa.simulate import simulate
    from nri_numa.simulate_render import render_json, render_text

    ctx, entries = _engine_inputs(args)
    sim = simulate(ctx, entries)
    print(render_json(sim) if args.json else render_text(sim))
    return _report_bad_entries(args.pods, sim.errors)


def cmd_explain(args: argparse.Namespace) -> int:
    from nri_numa.explain import explain_pod
    from nri_numa.explain_render import render_json, render_text
    from nri_numa.simulate import InputError, pod_key

    ctx, entries = _engine_inputs(args)
    try:
        explanation = explain_pod(ctx, entries, pod_key(args.pod), args.pods)
    except InputError as e:
        raise CliError(str(e)) from None
    print(render_json(explanation) if args.json else render_text(explanation, ctx))
    return _report_bad_entries(args.pods, explanation.errors)


def _add_source_options(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--root", default="/", metavar="PREFIX",
                        help="read sysfs under PREFIX/sys (and PREFIX/proc); default: / (this machine)")
    source.add_argument("--preset", metavar="NAME", help="a synthetic machine (see `nri-numa presets`)")
    source.add_argument("--topology", metavar="FILE",
                        help="a topology captured with `nri-numa topology --json`")
    p.add_argument("--no-nvml", action="store_true", help="do not ask NVML for GPUs")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    _add_source_options(p)
    p.add_argument("--config", required=True, metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (examples/config-*.yaml)")
    p.add_argument("--pods", required=True, metavar="FILE",
                   help="Pod manifests in YAML, and {delete: namespace/name} entries, in order")


# --- nri-numa run: the NRI plugin agent -------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    import logging

    from nri_numa.nri.daemon import DaemonError, DaemonOptions, run

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), filename=args.log_file,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    given = {"socket_path": args.nri_socket, "name": args.name, "index": args.index,
             "config_file": args.config and Path(args.config),
             "state_dir": args.state_dir and Path(args.state_dir),
             "topology_file": args.topology and Path(args.topology)}
    try:
        run(DaemonOptions(**{k: v for k, v in given.items() if v is not None}))
    except DaemonError as e:
        raise CliError(str(e)) from None
    return 0


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    # Defaults live in nri_numa.nri.daemon.DaemonOptions (importing it here would slow every
    # command down); the help texts repeat them, and a test keeps the two in step.
    p = sub.add_parser("run", help="run the NRI plugin (containerd, CRI-O) until stopped",
                       description="Connect to the runtime's NRI socket and place every container "
                                   "it creates; reconnects when the runtime restarts. Started by "
                                   "the runtime itself (NRI_PLUGIN_SOCKET set), serves fd 3.")
    p.add_argument("--nri-socket", metavar="PATH",
                   help="the runtime's NRI socket (default /var/run/nri/nri.sock)")
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML (packaging/nri-numa.conf.example)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where the ledger is kept across restarts (default /var/lib/nri-numa)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "this machine)")
    p.add_argument("--name", help="plugin name (default nri-numa)")
    p.add_argument("--index", metavar="NN",
                   help="plugin index, two digits: the order among plugins (default 90)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-file", metavar="FILE", help="log here instead of standard error")
    p.set_defaults(func=cmd_run)


# --- nri-numa hook: the OCI hook (runc, crun, podman, CRI-O) ----------------------------


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


def _add_hook_parser(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (default: every policy none)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "once and keep it in the state folder)")
    p.add_argument("--log-file", metavar="FILE",
                   help="where each run is logged (default <state-dir>/hook.log)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="give up (and fail) after this long; keep it below the runtime's hook "
                        "timeout (default 4)")
    p.add_argument("--cgroup-root", metavar="DIR", help=argparse.SUPPRESS)  # tests: fake trees
    p.add_argument("--proc-root", metavar="DIR", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_hook)


# --- nri-numa hook-daemon: the hook's engine, kept loaded -------------------------------


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


def _add_hook_daemon_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hook-daemon", help="serve `nri-numa hook` runs from one loaded process",
                       description="Load the machine, configuration and engine once and run "
                                   "every `nri-numa hook` that names the same --state-dir, one at "
                                   "a time, over <state-dir>/hook.sock (mode 0600). Hooks fall "
                                   "back to running in process while no daemon listens. Give it "
                                   "the --config and --topology the hooks are given.")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the hooks' state folder, which holds the socket (default /run/nri-numa)")
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (default: every policy none)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "once and keep it in the state folder)")
    p.add_argument("--log-file", metavar="FILE",
                   help="where the daemon and each run log (default <state-dir>/hook.log)")
    p.set_defaults(func=cmd_hook_daemon)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nri-numa",
        description="NUMA-aligned CPUs, memory and devices for containers.")
    parser.add_argument("--version", action="version", version=f"nri-numa {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("topology", help="show the machine: CPUs, NUMA nodes, memory, devices",
                       description="Show the machine as nri-numa sees it.")
    _add_source_options(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json",
                     help="the topology as JSON (docs/topology-json.md); replay it with --topology")
    fmt.add_argument("--tree", dest="format", action="store_const", const="tree",
                     help="package → NUMA node → L3 → core → threads, devices under their node")
    fmt.add_argument("--table", dest="format", action="store_const", const="table",
                     help="one row per NUMA node (the default)")
    p.set_defaults(func=cmd_topology, format="table")

    p = sub.add_parser("generate", help="write a fake sysfs tree (and fake NVML) for a machine",
                       description="Write a sysfs tree that `nri-numa topology --root OUT` reads back "
                                   "as the same machine: for tests, demos and what-if runs.")
    _add_source_options(p)
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("simulate", help="what would happen to these pods on this machine",
                       description="Run the pods of a file, in order, through the placement "
                                   "engine: where each container would go, or why not.")
    _add_engine_options(p)
    p.add_argument("--json", action="store_true",
                   help="every step as JSON (decisions, shared pool, per-node summary)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("explain", help="why one pod goes where it goes (or is refused)",
                       description="Show every provider's hints for one pod, the merge, and the "
                                   "rule that picked the winning NUMA nodes; the pod is placed "
                                   "after the entries before it in the pods file.")
    _add_engine_options(p)
    p.add_argument("--pod", required=True, metavar="NAME",
                   help="the pod: name (namespace default) or namespace/name")
    p.add_argument("--json", action="store_true", help="the explanation as JSON")
    p.set_defaults(func=cmd_explain)

    _add_run_parser(sub)
    _add_hook_parser(sub)
    _add_hook_daemon_parser(sub)

    p = sub.add_parser("presets", help="list the synthetic machines")
    p.set_defaults(func=cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["hook"]:
        # Before argparse and the engine: with a daemon, this is all a hook process loads.
        from nri_numa.hook.client import main as forward

        code = forward(given[1:])
        if code is not None:
            return code
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"nri-numa: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
