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
    from nri_numa.agent_settings import AgentSettings
    from nri_numa.simulate import Entry, Step
    from nri_numa.state_view import Checkpoint


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
    from nri_numa.logs import LogSetupError, configure
    from nri_numa.nri.daemon import DaemonError, DaemonOptions, run

    config_file = args.config and Path(args.config)
    settings = _run_settings(args, config_file)
    try:
        configure(settings.log_level, settings.log_format, settings.log_file)
    except LogSetupError as e:
        raise CliError(str(e)) from None
    try:
        run(DaemonOptions.from_settings(settings, config_file))
    except DaemonError as e:
        raise CliError(str(e)) from None
    return 0


def _run_settings(args: argparse.Namespace, config_file: Path | None) -> AgentSettings:
    """The agent's settings: defaults, then the config file's nriNuma map, then the flags;
    every problem in one error, before anything starts."""
    from nri_numa.agent_settings import SettingsError, resolve
    from nri_numa.inputs import InputFileError, read_config_document

    section = None
    if config_file is not None:
        try:
            section = read_config_document(config_file).settings
        except InputFileError as e:
            raise CliError(str(e)) from None
    flags = {"nri_socket": args.nri_socket, "state_dir": args.state_dir,
             "topology_file": args.topology, "plugin_name": args.name,
             "plugin_index": args.index, "metrics_address": args.metrics_address,
             "log_format": args.log_format, "log_level": args.log_level,
             "log_file": args.log_file, "pod_resources_socket": args.pod_resources_socket,
             "dev_root": args.dev_root, "device_injection": args.device_injection,
             "cdi_spec_dirs": args.cdi_spec_dirs}
    try:
        return resolve(section, str(config_file), flags)
    except SettingsError as e:
        raise CliError(str(e)) from None


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    # Defaults live in nri_numa.agent_settings (loaded only by `run`); the help texts repeat
    # them, and a test keeps the two in step. Every flag can also be set in the config file's
    # nriNuma map (docs/configuration.md); a flag given wins over the file.
    p = sub.add_parser("run", help="run the NRI plugin (containerd, CRI-O) until stopped",
                       description="Connect to the runtime's NRI socket and place every container "
                                   "it creates; reconnects when the runtime restarts. Started by "
                                   "the runtime itself (NRI_PLUGIN_SOCKET set), serves fd 3.")
    p.add_argument("--nri-socket", metavar="PATH",
                   help="the runtime's NRI socket (default /var/run/nri/nri.sock)")
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML, and these settings in a nriNuma: "
                        "map (packaging/nri-numa.conf.example)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where the ledger is kept across restarts (default /var/lib/nri-numa)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "this machine)")
    p.add_argument("--name", help="plugin name (default nri-numa)")
    p.add_argument("--index", metavar="NN",
                   help="plugin index, two digits: the order among plugins (default 90)")
    p.add_argument("--pod-resources-socket", metavar="PATH",
                   help="the kubelet's PodResources socket: CPUs and memory follow the devices "
                        "the kubelet gave each container, while the socket exists (default "
                        "/var/lib/kubelet/pod-resources/kubelet.sock; \"\" turns it off)")
    p.add_argument("--dev-root", metavar="DIR",
                   help="where the host's device nodes are, for the devices a container is "
                        "given (default /dev)")
    p.add_argument("--device-injection", choices=("nodes", "cdi", "auto"),
                   help="how GPUs are given: device nodes, CDI names the runtime injects, or "
                        "auto: CDI where the runtime applies it (containerd >= 2.1) and a CDI "
                        "spec names the GPU, else nodes (default auto)")
    p.add_argument("--cdi-spec-dirs", metavar="DIR[,DIR]",
                   help="CDI spec dirs, later ones winning, as the runtime's (default "
                        "/etc/cdi,/var/run/cdi)")
    p.add_argument("--metrics-address", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default "
                        "127.0.0.1:9109; \"off\" turns them off)")
    p.add_argument("--log-format", choices=("text", "json"),
                   help="text lines, or one JSON object per line with every decision's fields "
                        "(default text)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   help="(default info)")
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


def _add_hook_input_options(p: argparse.ArgumentParser) -> None:
    """--config and --topology, one definition for the hook and its daemon, which must be
    given the same files."""
    p.add_argument("--config", metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (default: every policy none)")
    p.add_argument("--topology", metavar="FILE",
                   help="a topology captured with `nri-numa topology --json` (default: discover "
                        "once and keep it in the state folder)")


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
    _add_hook_input_options(p)
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
    _add_hook_input_options(p)
    p.add_argument("--log-file", metavar="FILE",
                   help="where the daemon and each run log (default <state-dir>/hook.log)")
    p.set_defaults(func=cmd_hook_daemon)


# --- nri-numa state: the ledger on disk against the cgroups ---------------------------------

STATE_DRIFT = 3  # exit status of `nri-numa state` when a cgroup disagrees with the ledger


def cmd_state(args: argparse.Namespace) -> int:
    from nri_numa.state_render import render_json, render_text
    from nri_numa.state_view import StateViewError, build_view, read_checkpoint

    state_dir = Path(args.state_dir)
    try:
        checkpoint = read_checkpoint(state_dir)
        reserved = None
        if args.config:
            reserved = _reserved_cpus(args, checkpoint, state_dir)
        view = build_view(state_dir, checkpoint, Path(args.cgroup_root), reserved)
    except StateViewError as e:
        raise CliError(str(e)) from None
    print(render_json(view) if args.json else render_text(view))
    return STATE_DRIFT if view.drifted else 0


def _reserved_cpus(args: argparse.Namespace, checkpoint: Checkpoint,
                   state_dir: Path) -> frozenset[int]:
    """The reserved CPUs of --config on this machine, once the checkpoint is known to be
    this machine's."""
    from nri_numa.engine.config import ConfigError
    from nri_numa.engine.context import EngineContext
    from nri_numa.inputs import InputFileError, read_config_file, read_topology_file
    from nri_numa.state.checkpoint import FILE_NAME, machine_fingerprint
    from nri_numa.state_view import check_machine
    from nri_numa.topology import discover

    try:
        config = read_config_file(Path(args.config))
        topology = read_topology_file(Path(args.topology)) if args.topology else discover("/")
        check_machine(checkpoint, machine_fingerprint(topology), state_dir / FILE_NAME)
        return EngineContext.build(topology, config).reserved_cpus
    except (InputFileError, ConfigError) as e:
        raise CliError(str(e)) from None


def _add_state_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("state", help="what nri-numa placed, and cgroups that disagree (drift)",
                       description="Read the checkpoint in the state folder (without locking or "
                                   "changing it) and list every placed container with its CPUs, "
                                   "memory nodes, memory and devices, then compare each "
                                   "container's cgroup cpuset.cpus and cpuset.mems with the "
                                   "ledger. Exit status: 0 no drift, 1 error (no or untrusted "
                                   f"state), {STATE_DRIFT} drift found.")
    p.add_argument("--state-dir", default="/var/lib/nri-numa", metavar="DIR",
                   help="the plugin's state folder (default /var/lib/nri-numa); the OCI hook's "
                        "is /run/nri-numa")
    p.add_argument("--json", action="store_true", help="the state and the drift as JSON")
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup", metavar="PATH",
                   help="where the cgroup hierarchies are mounted (default /sys/fs/cgroup)")
    p.add_argument("--config", metavar="FILE",
                   help="the configuration nri-numa runs with: its reserved CPUs are shown "
                        "(the plugin's checkpoint records them, the hook's does not), and the "
                        "checkpoint is checked to be this machine's")
    p.add_argument("--topology", metavar="FILE",
                   help="with --config: the topology nri-numa runs with (default: discover "
                        "this machine)")
    p.set_defaults(func=cmd_state)


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
    _add_state_parser(sub)

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
