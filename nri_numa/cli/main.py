"""The ``nri-numa`` parser and ``main``: one subcommand per module of this package, listed in
the order ``nri-numa --help`` shows them."""

from __future__ import annotations

import argparse
import sys

from nri_numa import __version__
from nri_numa.cli import explain, generate, hook, hook_daemon, presets, run, simulate, state, topology
from nri_numa.cli.errors import CliError

COMMANDS = (topology, generate, simulate, explain, run, hook, hook_daemon, state, presets)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nri-numa",
        description="NUMA-aligned CPUs, memory and devices for containers.")
    parser.add_argument("--version", action="version", version=f"nri-numa {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command through argparse. The entry point (``main`` of the package nri_numa.cli)
    hands a hook run to the hook client first and comes here only to run it in process."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"nri-numa: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
