"""The ``nri-numa`` parser and ``main``: one subcommand per module of this package, listed in
the order ``nri-numa --help`` shows them."""

from __future__ import annotations

import argparse
import os
import sys

from nri_numa import __version__
from nri_numa.cli import (explain, generate, hook, hook_daemon, presets, run, scheduler_extender,
                          simulate, state, topology)
from nri_numa.cli.errors import CliError
from nri_numa.safeio.bounds import LINE_LIMIT, one_line

COMMANDS = (topology, generate, simulate, explain, run, hook, hook_daemon, state, presets,
            scheduler_extender)


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
    _escape_what_cannot_be_written()
    try:
        return args.func(args)
    except CliError as e:
        print(_error_line("error", str(e)), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: one line for the person, the traceback where it can go
        return _internal_error(e)


DEBUG_ENV = "NRI_NUMA_DEBUG"  # set (to anything): an internal error prints its traceback


def _error_line(kind: str, message: str) -> str:
    prefix = f"nri-numa: {kind}: "
    return prefix + one_line(message, LINE_LIMIT - len(prefix))


def _escape_what_cannot_be_written() -> None:
    """Standard output escapes what its encoding cannot write (a lone surrogate in a container
    id read back from the state) instead of raising halfway through a table; text that can be
    written comes out as before. Standard error does so already."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass


def _internal_error(e: Exception) -> int:
    """One line on standard error; the traceback goes to the agent's log when one is set up
    (``nri-numa run``), and to standard error under NRI_NUMA_DEBUG."""
    import logging

    logs = sys.modules.get("nri_numa.agent.logs")  # loaded by the commands that log
    logged = logs is not None and logs.configured()
    if logged:
        logging.getLogger("nri_numa").error("internal error", exc_info=e)
    where = "its traceback is in the log" if logged else f"{DEBUG_ENV}=1 shows where"
    if os.environ.get(DEBUG_ENV):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    detail = one_line(str(e), 200)
    print(_error_line("internal error", f"{type(e).__name__}: {detail} (a bug in nri-numa; "
                                        f"{where})"), file=sys.stderr)
    return 1
