"""Parse a command line with the given commands' parsers and run the chosen handler, with the
one-line errors every command shares.

``nri_numa.cli.main`` does so with every command. A hook run is parsed with the hook's parser
alone (``nri_numa.cli.hook.parse``, in its own process and in the hook daemon): it neither
builds the other nine commands' parsers nor imports their modules."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nri_numa import __version__
from nri_numa.cli.errors import CliError
from nri_numa.safeio.bounds import LINE_LIMIT, one_line

if TYPE_CHECKING:
    import argparse

DEBUG_ENV = "NRI_NUMA_DEBUG"  # set (to anything): an internal error prints its traceback


def build_parser(commands: Sequence[ModuleType]) -> argparse.ArgumentParser:
    """``nri-numa``'s parser with these commands (modules with ``add_parser``), in this order."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="nri-numa",
        description="NUMA-aligned CPUs, memory and devices for containers.")
    parser.add_argument("--version", action="version", version=f"nri-numa {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.add_parser(sub)
    return parser


def run(commands: Sequence[ModuleType], argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's) and run the command's handler."""
    return run_parsed(build_parser(commands).parse_args(argv))


def run_parsed(args: Any) -> int:
    """Run ``args.func(args)``: arguments parsed by ``build_parser``'s parser."""
    _escape_what_cannot_be_written()
    try:
        return args.func(args)
    except CliError as e:
        print(error_line("error", str(e)), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: one line for the person, the traceback where it can go
        return _internal_error(e)


def error_line(kind: str, message: str) -> str:
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
    print(error_line("internal error", f"{type(e).__name__}: {detail} (a bug in nri-numa; "
                                        f"{where})"), file=sys.stderr)
    return 1
