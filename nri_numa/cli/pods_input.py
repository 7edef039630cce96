"""What simulate and explain both take: a machine, a configuration and a pods file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa.cli.errors import CliError
from nri_numa.cli.machine_source import add_source_options, load_topology
from nri_numa.safeio.bounds import LINE_LIMIT, one_line

if TYPE_CHECKING:  # the engine loads only for the subcommands that use it
    from nri_numa.engine.context import EngineContext
    from nri_numa.views.simulate import Entry, Step


def add_engine_options(p: argparse.ArgumentParser) -> None:
    add_source_options(p)
    p.add_argument("--config", required=True, metavar="FILE",
                   help="KubeletConfiguration keys in YAML or JSON (examples/config-*.yaml)")
    p.add_argument("--pods", required=True, metavar="FILE",
                   help="Pod manifests in YAML, and {delete: namespace/name} entries, in order")


def engine_inputs(args: argparse.Namespace) -> tuple[EngineContext, list[Entry]]:
    """The engine context (machine + config) and the pods file's entries."""
    from nri_numa.views.simulate import InputError, build_context, load_config, load_pods

    topology = load_topology(args)
    try:
        config = load_config(Path(args.config))
        ctx = build_context(topology, config, Path(args.config))
        return ctx, load_pods(Path(args.pods))
    except InputError as e:
        raise CliError(str(e)) from None


def report_bad_entries(pods_file: str, steps: Sequence[Step]) -> int:
    """One error line per bad entry of the pods file; the exit status they call for."""
    prefix = "nri-numa: error: "
    for step in steps:  # one bounded line each, whatever the file's names hold
        line = one_line(f"{pods_file} {step.where}: {step.message}", LINE_LIMIT - len(prefix))
        print(prefix + line, file=sys.stderr)
    return 1 if steps else 0
