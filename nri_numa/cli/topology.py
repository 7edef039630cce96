"""``nri-numa topology``: the machine as nri-numa sees it, as a table, a tree or JSON."""

from __future__ import annotations

import argparse

from nri_numa.cli.machine_source import add_source_options, load_topology


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topology", help="show the machine: CPUs, NUMA nodes, memory, devices",
                       description="Show the machine as nri-numa sees it.")
    add_source_options(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="format", action="store_const", const="json",
                     help="the topology as JSON (docs/topology-json.md); replay it with --topology")
    fmt.add_argument("--tree", dest="format", action="store_const", const="tree",
                     help="package → NUMA node → L3 → core → threads, devices under their node")
    fmt.add_argument("--table", dest="format", action="store_const", const="table",
                     help="one row per NUMA node (the default)")
    p.set_defaults(func=cmd_topology, format="table")


def cmd_topology(args: argparse.Namespace) -> int:
    from nri_numa.topology.render import render_table, render_tree

    topology = load_topology(args)
    if args.format == "json":
        print(topology.to_json())
    elif args.format == "tree":
        print(render_tree(topology))
    else:
        print(render_table(topology))
    return 0
