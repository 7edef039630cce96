"""`nri-numa run` as a real process: settings from the config file's nriNuma map and the flags,
one clear error and exit status 1 for each bad start, JSON logs, metrics over HTTP, and the
refusal to start on placements made under other policies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, create, machine
from tests.tmpfs import fast_tmp

REPO = Path(__file__).resolve().parents[3]
KUBELET_KEYS = "".join(f"{k}: {v!r}\n" for k, v in CONFIG.items())


@pytest.fixture
def scratch(tmp_path: Path):
    with fast_tmp(tmp_path) as base:
        (base / "node.json").write_text(machine().to_json())
        yield base


def agent(scratch: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nri_numa", "run", "--topology", str(scratch / "node.json"),
         "--nri-socket", str(scratch / "absent.sock"), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def fails_to_start(scratch: Path, *args: str) -> str:
    """The one line on standard error of an agent that must not start."""
    process = agent(scratch, *args)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nri-numa: error: "), err
    return lines[0].removeprefix("nri-numa: error: ")


def config(scratch: Path, text: str) -> str:
    path = scratch / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, expected", [
    ("nriNuma:\n  metricsPort: 9\n", "nriNuma: unknown key 'metricsPort'; did you mean "
                                      "metricsAddress? (known keys: nriSocket"),
    ("nriNuma:\n  logFormat: xml\n", "nriNuma.logFormat: 'xml' is not one of text, json"),
    ("nriNuma:\n  metricsAddress: 127.0.0.1\n",
     "nriNuma.metricsAddress: '127.0.0.1' is not HOST:PORT"),
    ("nriNuma:\n  stateDir: [a, b]\n", "nriNuma.stateDir: must be a string (a path), not list"),
    ("nriNuma: on\n", "nriNuma must be a map of settings, not bool"),
    ("nriNuma:\n  pluginIndex: 7\n", "nriNuma.pluginIndex: 7 is not a plugin index"),
    ("NriNuma:\n  logLevel: info\n", "unknown key 'NriNuma'; did you mean nriNuma?"),
    ("cpuManagerPolicy: static\n", "the static policy requires"),
    ("nriNuma: {logFormat: json\n", "not valid YAML"),
])
def test_a_bad_config_file_is_one_clear_error(scratch, text, expected):
    path = config(scratch, text)
    problem = fails_to_start(scratch, "--config", path, "--state-dir", str(scratch / "s"))
    assert problem.startswith(f"{path}: ") and expected in problem, problem


def test_an_unreadable_config_file_is_one_clear_error(scratch):
    problem = fails_to_start(scratch, "--config", str(scratch / "missing.yaml"))
    assert problem == f"cannot read config file {scratch / 'missing.yaml'}: No such file or directory"


@pytest.mark.parametrize("args, expected", [
    (["--metrics-address", "9109"], "--metrics-address: '9109' is not HOST:PORT"),
    (["--index", "123"], "--index: '123' is not a plugin index: two digits, 00 to 99"),
    (["--log-file", "/nonexistent/dir/x.log"], "cannot open log file /nonexistent/dir/x.log"),
])
def test_a_bad_flag_is_one_clear_error(scratch, args, expected):
    assert expected in fails_to_start(scratch, "--state-dir", str(scratch / "s"), *args)


def test_an_asked_for_metrics_address_in_use_stops_the_start(scratch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        problem = fails_to_start(scratch, "--state-dir", str(scratch / "s"),
                                 "--metrics-address", f"127.0.0.1:{port}")
    assert problem == f"metrics address 127.0.0.1:{port}: cannot listen: Address already in use"


def wait_for_line(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if text in line:
                    return line
        time.sleep(0.05)
    raise AssertionError(f"{path} never said {text!r}: {path.read_text() if path.exists() else ''}")


def test_settings_from_the_file_and_flags_win(scratch):
    log_file = scratch / "agent.log"
    path = config(scratch, KUBELET_KEYS + "nriNuma:\n  logFormat: json\n  logLevel: debug\n"
                  f"  metricsAddress: '127.0.0.1:0'\n  stateDir: {scratch / 'from-file'}\n"
                  f"  logFile: {log_file}\n")
    process = agent(scratch, "--config", path, "--state-dir", str(scratch / "from-flag"))
    try:
        served = json.loads(wait_for_line(log_file, "metrics served on"))
        assert served["level"] == "info" and served["logger"] == "nri_numa.nri.daemon"
        url = served["msg"].removeprefix("metrics served on ")
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        assert "nri_numa_topology_manager_admission_requests_total 0.0" in body
        assert 'nri_numa_numa_node_free_cpus{numa_node="1"} 4.0' in body
        json.loads(wait_for_line(log_file, "attempt 2"))  # debug and info lines, all JSON
        assert (scratch / "from-flag" / "lock").exists()  # the flag won over the file
        assert not (scratch / "from-file").exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        process.kill()
    assert all(json.loads(line) for line in log_file.read_text().splitlines())


def test_placements_under_other_policies_stop_the_start(scratch):
    state = scratch / "state"
    topology = machine()
    plugin = NumaPlugin(topology, config_from_mapping(CONFIG),
                        CheckpointStore(state, machine_fingerprint(topology)))
    g = msg.pod("g")
    create(plugin, g, msg.guaranteed(g, "app", cpus=2))
    path = config(scratch, KUBELET_KEYS.replace("single-numa-node", "best-effort"))
    problem = fails_to_start(scratch, "--config", path, "--state-dir", str(state),
                             "--metrics-address", "off")
    assert problem.startswith(f"the configuration changed while {state / 'checkpoint.json'} "
                              "holds the placements of 1 container: topologyManagerPolicy "
                              "'single-numa-node' → 'best-effort'"), problem
    assert f"delete {state / 'checkpoint.json'}" in problem
    assert (state / "checkpoint.json").exists()


def test_run_help_states_the_settings_defaults():
    from nri_numa.agent.settings import AgentSettings
    from nri_numa.cli import build_parser

    run_parser = build_parser()._subparsers._group_actions[0].choices["run"]
    text = "".join(run_parser.format_help().split())  # argparse wraps even inside paths
    defaults = AgentSettings()
    for value in (defaults.metrics_address, defaults.log_format, defaults.log_level,
                  defaults.dev_root, defaults.pod_resources_socket):
        assert f"(default{value}" in text, value
