"""``nri-numa state``: what the ledger on disk says against the cgroups; its parser and handler."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa.cli.errors import CliError

if TYPE_CHECKING:
    from nri_numa.views.state_view import Checkpoint, StateView


STATE_DRIFT = 3  # exit status of `nri-numa state` when a cgroup disagrees with the ledger


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--kubelet-state-dir", metavar="DIR",
                   help="also compare the exclusive CPUs and memory nodes with the kubelet's "
                        "CPU and Memory Manager checkpoints DIR/cpu_manager_state and "
                        "DIR/memory_manager_state (docs/migrating-from-kubelet.md); "
                        f"a disagreement counts as drift (exit status {STATE_DRIFT})")
    p.set_defaults(func=cmd_state)


def cmd_state(args: argparse.Namespace) -> int:
    from nri_numa.views.state_render import render_text, view_dict
    from nri_numa.views.state_view import StateViewError, build_view, read_checkpoint

    state_dir = Path(args.state_dir)
    try:
        checkpoint = read_checkpoint(state_dir)
        reserved = None
        if args.config:
            reserved = _reserved_cpus(args, checkpoint, state_dir)
        view = build_view(state_dir, checkpoint, Path(args.cgroup_root), reserved)
    except StateViewError as e:
        raise CliError(str(e)) from None
    files, against = (_against_kubelet(view, Path(args.kubelet_state_dir))
                      if args.kubelet_state_dir else ([], None))
    if args.json:
        document = view_dict(view)
        if against is not None:
            document["kubelet_disagreements"] = against
        print(json.dumps(document, indent=2))
    else:
        print(render_text(view))
        if against is not None:
            print(f"\nAgainst the kubelet's {' and '.join(files)}: "
                  + ("they agree" if not against else f"{len(against)} disagreements"))
            for line in against:
                print(f"  {line}")
    return STATE_DRIFT if view.drifted or against else 0


def _against_kubelet(view: StateView, folder: Path) -> tuple[list[str], list[str]]:
    """The checkpoint files read from ``folder`` and the disagreements with them."""
    from nri_numa.state.kubelet_checkpoints import (CPU_STATE_FILE, MEMORY_STATE_FILE,
                                                    KubeletCheckpointError, KubeletPlacements,
                                                    read_cpu_state, read_memory_state)
    from nri_numa.views.kubelet_view import disagreements

    names = [n for n in (CPU_STATE_FILE, MEMORY_STATE_FILE) if (folder / n).exists()]
    if not names:
        raise CliError(f"{folder}: neither {CPU_STATE_FILE} nor {MEMORY_STATE_FILE}")
    try:
        kubelet = KubeletPlacements(
            read_cpu_state(folder / CPU_STATE_FILE) if CPU_STATE_FILE in names else None,
            read_memory_state(folder / MEMORY_STATE_FILE) if MEMORY_STATE_FILE in names else None)
    except KubeletCheckpointError as e:
        raise CliError(str(e)) from None
    return names, disagreements(view, kubelet)


def _reserved_cpus(args: argparse.Namespace, checkpoint: Checkpoint,
                   state_dir: Path) -> frozenset[int]:
    """The reserved CPUs of --config on this machine, once the checkpoint is known to be
    this machine's."""
    from nri_numa.agent.inputs import InputFileError, read_config_file, read_topology_file
    from nri_numa.engine.config import ConfigError
    from nri_numa.engine.context import EngineContext
    from nri_numa.state.checkpoint import FILE_NAME, machine_fingerprint
    from nri_numa.topology import discover
    from nri_numa.views.state_view import check_machine

    try:
        config = read_config_file(Path(args.config))
        topology = read_topology_file(Path(args.topology)) if args.topology else discover("/")
        check_machine(checkpoint, machine_fingerprint(topology), state_dir / FILE_NAME)
        return EngineContext.build(topology, config).reserved_cpus
    except (InputFileError, ConfigError) as e:
        raise CliError(str(e)) from None
