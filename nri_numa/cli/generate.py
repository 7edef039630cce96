"""``nri-numa generate``: write a machine out as a sysfs tree (and fake NVML) to read back."""

from __future__ import annotations

import argparse
from pathlib import Path

from nri_numa.cli.errors import CliError
from nri_numa.cli.machine_source import add_source_options, load_topology


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="write a fake sysfs tree (and fake NVML) for a machine",
                       description="Write a sysfs tree that `nri-numa topology --root OUT` reads back "
                                   "as the same machine: for tests, demos and what-if runs.")
    add_source_options(p)
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from nri_numa.topology.synthetic import write_tree

    topology = load_topology(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise CliError(f"{out} exists and is not empty; give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    write_tree(topology, out)
    print(f"wrote a sysfs tree of {len(topology.cpus)} CPUs, {len(topology.numa_nodes)} NUMA nodes, "
          f"{len(topology.gpus)} GPUs to {out}; read it with: nri-numa topology --root {out}")
    return 0
