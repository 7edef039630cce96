"""The ``nri-numa`` parser and ``main``: one subcommand per module of this package, listed in
the order ``nri-numa --help`` shows them."""

from __future__ import annotations

import argparse

from nri_numa.cli import (explain, generate, hook, hook_daemon, presets, run, scheduler_extender,
                          simulate, state, topology)
from nri_numa.cli import dispatch
from nri_numa.cli.dispatch import DEBUG_ENV

__all__ = ["COMMANDS", "DEBUG_ENV", "build_parser", "main"]

COMMANDS = (topology, generate, simulate, explain, run, hook, hook_daemon, state, presets,
            scheduler_extender)


def build_parser() -> argparse.ArgumentParser:
    return dispatch.build_parser(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    """Every command through argparse. The entry point (``main`` of the package nri_numa.cli)
    parses a hook run with the hook's parser alone (``nri_numa.cli.hook.parse``)."""
    return dispatch.run(COMMANDS, argv)
