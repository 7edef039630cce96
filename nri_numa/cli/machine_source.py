"""Where a command's machine comes from: this machine's sysfs (``--root``), a synthetic machine
(``--preset``) or a captured topology (``--topology``). Shared by topology, generate, simulate and
explain."""

from __future__ import annotations

import argparse
from pathlib import Path

from nri_numa.cli.errors import CliError


def add_source_options(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--root", default="/", metavar="PREFIX",
                        help="read sysfs under PREFIX/sys (and PREFIX/proc); default: / (this machine)")
    source.add_argument("--preset", metavar="NAME", help="a synthetic machine (see `nri-numa presets`)")
    source.add_argument("--topology", metavar="FILE",
                        help="a topology captured with `nri-numa topology --json`")
    p.add_argument("--no-nvml", action="store_true", help="do not ask NVML for GPUs")


def load_topology(args: argparse.Namespace):
    from nri_numa.agent.inputs import InputFileError, read_topology_file
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
