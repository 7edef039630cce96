"""``nri-numa``: the command line. Each subcommand is a small function over the library.

The parser and ``main`` are here, with the subcommands on a machine description (topology,
generate, presets, simulate, explain); the ones a runtime starts (run, hook, hook-daemon) are in
``nri_numa.cli_agents``, and ``state`` in ``nri_numa.cli_state``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa import __version__
from nri_numa.cli_agents import add_hook_daemon_parser, add_hook_parser, add_run_parser
from nri_numa.cli_error import CliError
from nri_numa.cli_state import add_state_parser

if TYPE_CHECKING:  # the engine loads only for the subcommands that use it
    from nri_numa.engine.context import EngineContext
    from nri_numa.simulate import Entry, Step


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

    add_run_parser(sub)
    add_hook_parser(sub)
    add_hook_daemon_parser(sub)
    add_state_parser(sub)

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
