"""``nri-numa``: the command line, a front door for people. One module per subcommand, each
with its parser (``add_parser``) and handler (``cmd_<name>``); ``nri_numa.cli.main`` builds the
parser from them. Handlers import the library they use inside the function, so each command
loads only what it needs.

``main`` here is the entry point. A hook run (``nri-numa hook``, which the hooks' thin client
execs when no hook daemon takes the run) is read by the hook's parser alone: every hook process
pays for each module it loads, and a burst of container starts runs fifty of them at once.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] != ["hook"]:
        return _commands().main(argv)
    code = _without_cyclic_gc(_hook, given)
    if argv is None:  # the hook process itself, run by the runtime
        _exit_now(code)
    return code


def _hook(given: list[str]) -> int:
    from nri_numa.cli import dispatch, hook

    return dispatch.run_parsed(hook.parse(given[1:]))


def _without_cyclic_gc(run: Any, *args: Any) -> int:
    """``run(*args)`` with the cyclic garbage collector off. A hook process lives well under a
    second; run in process, it allocates as it imports the engine, and the collector's passes
    over everything loaded so far find nothing worth freeing. Reference counting still frees
    what it always frees; the process then ends."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run(*args)
    finally:
        if was_enabled:  # a test running the command inside its own process
            gc.enable()


def _exit_now(code: int) -> None:
    """End the hook process without finalizing the interpreter: with the engine loaded that
    takes tens of ms of CPU, which a burst on two CPUs stretches towards the runtime's kill.
    Everything the run wrote is on disk already (os.write, fsync; the log handler is closed)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_entry_point = main


def _commands() -> ModuleType:
    """nri_numa.cli.main, with argparse and every command's module, loaded on first use."""
    module = importlib.import_module("nri_numa.cli.main")
    # Importing a submodule sets it as the package's attribute of that name: ``main`` here would
    # then be the module nri_numa.cli.main instead of this function.
    globals()["main"] = _entry_point
    return module


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        return _commands().build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
