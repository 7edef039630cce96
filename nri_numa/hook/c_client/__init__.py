"""The hook's C client (``nri-numa-hook-client.c`` beside this file, package data) and its
build: ``python -m nri_numa.hook.c_client`` compiles it on a node with a C compiler, with the
interpreter nri-numa is installed in (which it execs as ``nri-numa hook`` when no daemon
takes the run) and the socket's variable and default path (nri_numa.hook.client) fixed into it.

The client is the fastest hook path (docs/oci-hook.md, "The C client"); without a compiler the
Python client (nri_numa/hook/client.py) does the same, slower.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nri_numa.hook import client

SOURCE = Path(__file__).resolve().with_name("nri-numa-hook-client.c")
BINARY_NAME = "nri-numa-hook-client"
CFLAGS = ("-O2", "-std=c99", "-Wall", "-Wextra", "-Werror")


class BuildError(Exception):
    """The client cannot be built; the message says why, in one line."""


def default_output(python: str) -> Path:
    """Beside the interpreter: ``<venv>/bin/nri-numa-hook-client``."""
    return Path(python).parent / BINARY_NAME


def find_compiler(name: str | None = None) -> str | None:
    """The C compiler to use: ``name``, else $CC, else cc, gcc or clang on PATH."""
    for candidate in ([name] if name else [os.environ.get("CC"), "cc", "gcc", "clang"]):
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    return None


def python_literal(python: str) -> str:
    """``python`` as the C string literal the source is compiled with."""
    if not os.path.isabs(python):
        raise BuildError(f"the interpreter {python!r} is not an absolute path: a hook's PATH "
                         "would decide which Python runs")
    return c_string(python, "the interpreter path")


def c_string(text: str, what: str = "the path") -> str:
    """``text`` as a C string literal, where it needs no escape."""
    if any(not (" " <= c <= "~") or c in '"\\' for c in text):
        raise BuildError(f"{what} {text!r} holds a character this build does not quote (only "
                         "printable ASCII without quotes or backslashes)")
    return f'"{text}"'


def installed(python: str) -> None:
    """BuildError unless ``python`` imports nri-numa: the client execs it as ``nri-numa hook``."""
    done = subprocess.run([python, "-I", "-c", "import nri_numa.cli"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise BuildError(f"{python} cannot import nri-numa: {last}")


def build(output: Path, python: str, compiler: str | None = None) -> Path:
    """Compile the client to ``output`` (replaced atomically: a hook running the old one is
    never handed half a file) for the interpreter ``python``."""
    cc = find_compiler(compiler)
    if cc is None:
        raise BuildError(f"no C compiler found ({compiler or 'cc, gcc, clang'}): the hooks keep "
                         "the Python client (nri_numa/hook/client.py)")
    defines = [f"-DPYTHON={python_literal(python)}",
               f"-DDEFAULT_SOCKET={c_string(client.DEFAULT_SOCKET)}",
               f"-DSOCKET_ENV={c_string(client.SOCKET_ENV)}"]
    installed(python)
    output = Path(output)
    if not output.parent.is_dir():
        raise BuildError(f"{output.parent} is not a folder")
    fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *CFLAGS, *defines, "-o", temp, str(SOURCE)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            raise BuildError(f"{cc} failed (exit {done.returncode}): {first}")
        os.chmod(temp, 0o755)
        os.replace(temp, output)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return output


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m nri_numa.hook.c_client",
        description="Build the OCI hook's C client, nri-numa-hook-client (docs/oci-hook.md, "
                    "\"The C client\"), for this Python's nri-numa.")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"where to put it (default: beside this interpreter, "
                             f"{default_output(sys.executable)})")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter nri-numa is installed in, which the client runs "
                             "when it does not forward a run itself (default: this one)")
    parser.add_argument("--cc", default=None,
                        help="the C compiler (default: $CC, else cc, gcc or clang)")
    args = parser.parse_args(argv)
    try:
        built = build(args.output or default_output(args.python), args.python, args.cc)
    except (BuildError, OSError) as e:
        print(f"nri-numa hook client: {e}", file=sys.stderr)
        return 1
    print(built)
    return 0
