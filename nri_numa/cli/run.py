"""``nri-numa run``: the NRI plugin as a long-running agent (nri_numa.nri.daemon)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa.cli.errors import CliError

if TYPE_CHECKING:
    from nri_numa.agent.settings import AgentSettings
    from nri_numa.agent.signals import StopSignals
    from nri_numa.nri.config_reload import Reread


def add_parser(sub: argparse._SubParsersAction) -> None:
    # Defaults live in nri_numa.agent.settings (loaded only by `run`); the help texts repeat
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
    p.add_argument("--watch-config", action="store_true",
                   help="read --config again whenever the file changes, as on SIGHUP (log, "
                        "metrics and placement options apply at once; a policy change waits "
                        "until no placed container runs)")
    k8s = p.add_argument_group("Kubernetes (docs/kubernetes.md)")
    k8s.add_argument("--kubeconfig", metavar="FILE",
                     help="keep this node's NodeResourceTopology object in the cluster this "
                          "kubeconfig names (default: the pod's service account, when the agent "
                          "runs in a pod)")
    k8s.add_argument("--node-name", metavar="NAME",
                     help="the Node this agent runs on (default $NODE_NAME, else the host name)")
    k8s.add_argument("--nrt-export", choices=("auto", "on", "off"),
                     help="export NodeResourceTopology: auto does when a kubeconfig or a service "
                          "account is there (default auto)")
    k8s.add_argument("--nrt-resync-period", metavar="SECONDS",
                     help="how often the object is read back and mended when someone else "
                          "changed it (default 60)")
    p.add_argument("--kubelet-state-dir", metavar="DIR",
                   help="the kubelet's root: the CPUs and memory its static policies gave "
                        "running containers (DIR/cpu_manager_state, DIR/memory_manager_state) "
                        "are kept at the first Synchronize instead of placing them anew "
                        "(default /var/lib/kubelet when it has those files)")
    k8s.add_argument("--evict-refused-pods", choices=("true", "false"),
                     help="evict a refused pod that a controller owns, so that it is made again "
                          "and can be scheduled elsewhere (default true; a bare pod is never "
                          "deleted)")
    k8s.add_argument("--evict-after-refusals", metavar="N",
                     help="refusals of a pod before it is evicted (default 3)")
    k8s.add_argument("--eviction-delay", metavar="SECONDS",
                     help="no eviction sooner than this after a pod's first refusal (default 30)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from nri_numa.agent.signals import StopSignals, Stopped

    # First, before the agent's modules load and before any file is opened: a SIGTERM while
    # it starts ends it cleanly (exit 0), wherever start-up is.
    signals = StopSignals()
    try:
        return _start(args, signals)
    except Stopped:
        return 0
    finally:
        signals.restore()


def _start(args: argparse.Namespace, signals: StopSignals) -> int:
    from nri_numa.agent.logs import configure
    from nri_numa.nri.daemon import DaemonError, DaemonOptions, run
    from nri_numa.safeio.log_files import LogSetupError

    config_file = args.config and Path(args.config)
    settings = _run_settings(args, config_file)
    try:
        configure(settings.log_level, settings.log_format, settings.log_file)
    except LogSetupError as e:
        raise CliError(str(e)) from None
    options = DaemonOptions.from_settings(settings, config_file)
    if config_file is not None:
        options = replace(options, reread=lambda: _reread(args, config_file),
                          watch_config=args.watch_config)
    elif args.watch_config:
        raise CliError("--watch-config needs --config FILE")
    try:
        run(options, signals=signals)
    except DaemonError as e:
        raise CliError(str(e)) from None
    return 0


def _reread(args: argparse.Namespace, config_file: Path) -> Reread:
    """The file read again, the flags still winning; ValueError (one line) when it is bad."""
    from nri_numa.agent.inputs import read_config_document
    from nri_numa.agent.settings import resolve
    from nri_numa.nri.config_reload import Reread

    document = read_config_document(config_file)
    settings = resolve(document.settings, str(config_file), _flags(args))
    return Reread(document.engine, settings, document.ignored_kubelet_keys)


def _run_settings(args: argparse.Namespace, config_file: Path | None) -> AgentSettings:
    """The agent's settings: defaults, then the config file's nriNuma map, then the flags;
    every problem in one error, before anything starts."""
    from nri_numa.agent.settings import SettingsError, resolve
    from nri_numa.agent.inputs import InputFileError, read_config_document

    section = None
    if config_file is not None:
        try:
            section = read_config_document(config_file).settings
        except InputFileError as e:
            raise CliError(str(e)) from None
    try:
        return resolve(section, str(config_file), _flags(args))
    except SettingsError as e:
        raise CliError(str(e)) from None


def _flags(args: argparse.Namespace) -> dict[str, str | None]:
    return {"nri_socket": args.nri_socket, "state_dir": args.state_dir,
            "topology_file": args.topology, "plugin_name": args.name,
            "plugin_index": args.index, "metrics_address": args.metrics_address,
            "log_format": args.log_format, "log_level": args.log_level,
            "log_file": args.log_file, "pod_resources_socket": args.pod_resources_socket,
            "dev_root": args.dev_root, "device_injection": args.device_injection,
            "cdi_spec_dirs": args.cdi_spec_dirs, "kubeconfig": args.kubeconfig,
            "node_name": args.node_name, "nrt_export": args.nrt_export,
            "nrt_resync_period": args.nrt_resync_period,
            "evict_refused_pods": args.evict_refused_pods,
            "evict_after_refusals": args.evict_after_refusals,
            "eviction_delay": args.eviction_delay,
            "kubelet_state_dir": args.kubelet_state_dir}
