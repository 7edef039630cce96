"""The hook's C client, nri-numa-hook-client: its build (python -m nri_numa.hook.c_client) and
what the build fixes into it. What it does as a hook, beside the Python client, is in
tests/integration/hook/test_thin_clients.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.hook import c_client, client
from tests.integration.hook.test_thin_clients import RecordingDaemon, run

REPO = Path(__file__).resolve().parents[3]


def test_the_socket_variable_and_default_are_the_python_clients(c_client_binary):
    """Fixed at build time from nri_numa.hook.client, as the compiler was given them."""
    binary = c_client_binary.read_bytes()
    for value in (client.SOCKET_ENV, client.DEFAULT_SOCKET, sys.executable):
        assert value.encode() + b"\0" in binary
    assert client.DEFAULT_SOCKET == f"{client.DEFAULT_STATE_DIR}/{client.SOCKET_NAME}"


def test_the_source_is_small_and_reads_no_argument():
    """The daemon or ``nri-numa hook`` reads the arguments; the client only passes them on."""
    source = c_client.SOURCE.read_text()
    assert len(source.splitlines()) <= 300
    for reader in ("strcmp", "strncmp", "strtod", "atof", "getopt", "argv[1]"):
        assert reader not in source


def test_the_installed_package_carries_the_source_and_builds_it_without_the_tree(
        tmp_path, c_client_binary):
    """setuptools' build_py of a copy of the project (what a wheel holds) has the C file as
    package data, and the build command run from there, outside any checkout, makes a client
    that forwards (the compiler is there: the fixture built one)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (project / name).write_bytes((REPO / name).read_bytes())
    shutil.copytree(REPO / "nri_numa", project / "nri_numa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                    "build_py", "--build-lib", str(lib)], cwd=project, check=True,
                   capture_output=True)
    assert (lib / "nri_numa" / "hook" / "c_client" / "nri-numa-hook-client.c").is_file()
    built = tmp_path / "bin" / "client"
    built.parent.mkdir()
    done = subprocess.run([sys.executable, "-I", "-m", "nri_numa.hook.c_client", "--output",
                           str(built)], cwd=lib, capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, str(built)), done.stderr
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    try:
        done = run([str(built)], ["poststop"], b"{}", state)
    finally:
        daemon.close()
    assert done.returncode == 7 and daemon.runs == [(b"poststop\0", b"{}")]


def test_a_build_that_cannot_be_done_says_why_in_one_line(tmp_path, c_client_binary):
    for args, said in ((["--cc", "no-such-cc"], "no C compiler found (no-such-cc)"),
                       (["--python", "python3"], "is not an absolute path"),
                       (["--python", '/o/"x'], "holds a character this build does not quote"),
                       (["--output", str(tmp_path / "none" / "x")], "is not a folder")):
        done = subprocess.run([sys.executable, "-m", "nri_numa.hook.c_client", *args],
                              capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 1 and done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith("nri-numa hook client: ") and said in line


def test_with_no_daemon_it_becomes_nri_numa_hook_in_its_interpreter(tmp_path):
    """The fallback is ``nri-numa hook`` in the interpreter fixed at build time (``-I``: no
    user or environment paths, but site's packages); the hook then places the container in that
    process."""
    from nri_numa.topology.synthetic import preset_topology
    from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

    if c_client.find_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build nri-numa-hook-client")
    seen = tmp_path / "argv"
    python = tmp_path / "python3"  # records how the client runs it, then is the interpreter
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    built = c_client.build(tmp_path / c_client.BINARY_NAME, str(python))
    seen.unlink()  # the build asked the interpreter whether it imports nri-numa

    topology = preset_topology("intel-2s-ht")
    host = FakeHost(tmp_path / "host", 1, topology.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
    args = ["createRuntime", "--state-dir", str(tmp_path / "state"), "--config", str(config),
            "--topology", str(topology_file(tmp_path, topology)),
            "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]
    bundle = write_bundle(host.base, "c1", 1)
    host.start(4242, "/pods/c1")
    done = run([str(built)], args, oci_state("c1", 4242, bundle), tmp_path / "no-daemon")
    assert done.returncode == 0, done.stderr
    assert seen.read_text().splitlines() == ["-I", "-m", "nri_numa", "hook", *args]
    assert len(host.cpus("/pods/c1")) == 1
