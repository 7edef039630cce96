"""The reproductions of the reliability issue's items 1 and 5 (bounded inputs, one-line
errors), one case each, through the real command line. Each failed before the change: a
traceback instead of a line (a map where a string belongs, a YAML tag, deep nesting), a lost
log line (a lone surrogate in a hook's container id), work without end (CPU lists), a megabyte
echoed back, or an error over three lines (docs/refusals.md, "Bad input")."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.cli import main
from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, topology_file, write_bundle

REPO = Path(__file__).resolve().parents[2]
PODS = REPO / "examples" / "pods-dgx.yaml"
LINE_LIMIT = 500


def one_error_line(err: str, *needles: str) -> str:
    """The one line an input error must be: no traceback, bounded, naming what it should."""
    assert "Traceback" not in err and "Logging error" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    line = err[:-1]
    assert line.startswith("nri-numa: error: ") and len(line) <= LINE_LIMIT, line
    for needle in needles:
        assert needle in line, line
    return line


def simulate(capsys, config: Path) -> tuple[int, str]:
    code = main(["simulate", "--preset", "dgx-h100", "--config", str(config), "--pods", str(PODS)])
    return code, capsys.readouterr().err


def run_agent(capsys, tmp_path: Path, config: Path) -> tuple[int, str]:
    """``nri-numa run`` as far as it gets: the configuration is checked before anything starts
    (no socket is ever connected to). The agent sets up the root logger; it is put back."""
    topology = tmp_path / "topology.json"
    topology.write_text(preset_topology("dgx-h100").to_json())
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(["run", "--config", str(config), "--topology", str(topology), "--state-dir",
                     str(tmp_path / "state"), "--nri-socket", str(tmp_path / "absent.sock"),
                     "--metrics-address", "off"])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return code, capsys.readouterr().err


def cli_process(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``nri-numa`` in a child with 2 GiB of address space: expanding a list without bound
    ends in MemoryError (a traceback) there, not in the test machine's swap. The limit is set by
    util-linux's prlimit, not a preexec_fn: that runs Python in a forked copy of this process,
    whose gRPC threads (earlier tests') are not copied, and gRPC's poller aborted there
    (SIGABRT, "epoll_wait error: Bad file descriptor")."""
    return subprocess.run(["prlimit", f"--as={2 << 30}", sys.executable, "-m", "nri_numa", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("command", ["simulate", "run"])
@pytest.mark.parametrize("text, needle", [
    # Was: TypeError: unhashable type: 'dict', with its traceback.
    ("topologyManagerScope: {a: 1}\n",
     "topologyManagerScope: {'a': 1} is not one of container, pod"),
    # Was: ValueError: could not convert string to float: 'y'.
    ("topologyManagerScope: !!float y\n", "config.yaml: line 1: 'y' cannot be read as !!float"),
    # Was: RecursionError from PyYAML's composer.
    ("topologyManagerScope: " + "[" * 1000 + "\n",
     "config.yaml: line 1: nested deeper than 64 levels"),
], ids=["a map where a string belongs", "a YAML tag its value does not fit", "a thousand brackets"])
def test_a_bad_configuration_is_one_line(tmp_path, capsys, command, text, needle):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    code, err = (simulate(capsys, config) if command == "simulate"
                 else run_agent(capsys, tmp_path, config))
    assert code == 1
    one_error_line(err, needle)


@pytest.mark.parametrize("cpus, needle", [
    ("0-4294967295", "'0-4294967295': ids go up to 65535"),
    # Every range within bounds, their sum not: 1.3 billion ids to expand.
    ("0-65535," * 20000 + "0", "names more than 65536 ids, counting repeats"),
])
def test_a_cpu_list_is_measured_before_it_is_expanded(tmp_path, cpus, needle):
    # Was: the list expanded until memory ran out (or for minutes).
    config = tmp_path / "config.yaml"
    config.write_text(f'cpuManagerPolicy: static\nreservedSystemCPUs: "{cpus}"\n')
    done = cli_process(["simulate", "--preset", "dgx-h100", "--config", str(config),
                        "--pods", str(PODS)], timeout=60)
    assert done.returncode == 1
    one_error_line(done.stderr, "reservedSystemCPUs: invalid configuration", needle)


def test_a_megabyte_value_is_quoted_by_its_first_characters(tmp_path, capsys):
    # Was: the whole value echoed back, one line of a megabyte.
    config = tmp_path / "config.yaml"
    config.write_text("topologyManagerPolicy: " + "x" * 1_000_000 + "\n")
    code, err = simulate(capsys, config)
    assert code == 1
    one_error_line(err, "topologyManagerPolicy: '" + "x" * 40 + "…' (1000000 characters) is "
                        "not one of none, best-effort, restricted, single-numa-node")


def test_problems_against_the_machine_are_one_line(tmp_path, capsys):
    # Was: "2 problems in the configuration:" and one more line per problem.
    config = tmp_path / "config.yaml"
    config.write_text('cpuManagerPolicy: static\nreservedSystemCPUs: "0,500"\n'
                      "memoryManagerPolicy: Static\n"
                      "reservedMemory: [{numaNode: 7, limits: {memory: 1Gi}}]\n")
    code, err = run_agent(capsys, tmp_path, config)
    assert code == 1
    one_error_line(err, "2 problems in the configuration:", '"0,500" are present',
                   "references a NUMA node 7")


def test_a_lone_surrogate_in_a_hook_container_id_is_placed_and_logged(tmp_path, capsys,
                                                                       monkeypatch):
    # Was: placed, but a "--- Logging error ---" traceback on stderr and no line in the log.
    topology = preset_topology("intel-2s-ht")
    host = FakeHost(tmp_path / "host", 2, topology.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48"}))
    bundle = write_bundle(host.base, "x", cpus=2)
    host.start(500, "/pods/x")
    state = tmp_path / "state"
    stdin = (f'{{"ociVersion": "1.0.2", "id": "\\udc80x", "status": "creating", "pid": 500, '
             f'"bundle": "{bundle}"}}').encode()
    monkeypatch.setattr(sys, "stdin", type("Stdin", (), {"buffer": io.BytesIO(stdin)})())
    # --timeout counts from the start of the process, here pytest's: a day, the most.
    code = main(["hook", "createRuntime", "--state-dir", str(state), "--config", str(config),
                 "--topology", str(topology_file(tmp_path, topology)), "--cgroup-root",
                 str(host.cgroup_root), "--proc-root", str(host.proc), "--timeout", "86400"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "" and err == ""
    assert len(host.cpus("/pods/x")) == 2
    [line] = (state / "hook.log").read_text().splitlines()
    assert "placed container \\udc80x: cpus " in line
    # The state that holds the id is still readable, and shows it escaped.
    assert main(["state", "--state-dir", str(state), "--cgroup-root", str(host.cgroup_root)]) == 0
    out, err = capsys.readouterr()
    assert "\\udc80x" in out and err == ""
