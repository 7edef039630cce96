"""``nri-numa run``: reconnecting with backoff, the pre-launched mode, start-up errors, and a
clean exit on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.cli import build_parser
from nri_numa.nri import daemon as d
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import NriSession
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime
from tests.integration.nri.plugin_env import agent_files, new_plugin
from tests.polling import until

REPO = Path(__file__).resolve().parents[3]


def test_backoff_doubles_up_to_the_cap_with_jitter():
    low = d.backoff_delays(first=0.5, cap=4.0, rng=lambda: 0.0)
    assert [next(low) for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    high = d.backoff_delays(first=0.5, cap=4.0, rng=lambda: 0.999)
    assert [round(next(high), 2) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    draws = [delay for delay, _ in zip(d.backoff_delays(first=1, cap=1), range(50))]
    assert all(0.5 <= x < 1 for x in draws) and len(set(draws)) > 1  # jittered


class Runtimes:
    """A connect() that fails ``failures`` times, then hands out sessions to fake runtimes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.runtimes: list[FakeRuntime] = []

    def __call__(self, path: str) -> NriSession:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise ConnectionError(f"cannot connect to the NRI socket {path}: Connection refused")
        plugin_end, runtime_end = socket.socketpair()
        self.runtimes.append(FakeRuntime(runtime_end).start())
        return NriSession(plugin_end)


def test_external_mode_retries_then_reconnects_after_a_runtime_restart(caplog):
    caplog.set_level("INFO", logger=d.__name__)
    connect = Runtimes(failures=3)
    sender = d.UpdateSender()
    daemon = d.Daemon(new_plugin(), sender, d.DaemonOptions(socket_path="/x/nri.sock"),
                      connect=connect, delays=iter(lambda: 0.01, None))
    worker = threading.Thread(target=daemon.run_external, daemon=True)
    worker.start()
    try:
        until(lambda: connect.runtimes and connect.runtimes[0].registered.is_set(), 5)
        assert connect.attempts == 4
        first = connect.runtimes[0]
        assert first.configure().events == 0x6CF
        first.synchronize()
        first.close()  # containerd restarts: the plugin sees EOF and connects again
        until(lambda: len(connect.runtimes) == 2 and connect.runtimes[1].registered.is_set(), 5)
        second = connect.runtimes[1]
        second.configure()
        sandbox = msg.pod("g")
        reply = second.call("CreateContainer", msg.create(sandbox, msg.guaranteed(sandbox, "a", 1)),
                            api.CreateContainerResponse)
        assert reply.adjust.linux.resources.cpu.cpus
    finally:
        daemon.stop()
        worker.join(5)
        sender.stop()
        for runtime in connect.runtimes:
            runtime.close()
    assert not worker.is_alive()
    assert "attempt 4" in caplog.text and "Connection refused" in caplog.text
    assert "NRI session ended" in caplog.text


def test_external_mode_waits_for_the_socket_to_appear(scratch):
    path = scratch / "nri.sock"
    sender = d.UpdateSender()
    daemon = d.Daemon(new_plugin(), sender, d.DaemonOptions(socket_path=str(path)),
                      delays=iter(lambda: 0.02, None))
    worker = threading.Thread(target=daemon.run_external, daemon=True)
    worker.start()
    time.sleep(0.1)  # several attempts against a missing socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(5)
    conn, _ = listener.accept()
    runtime = FakeRuntime(conn).start()
    try:
        assert runtime.registered.wait(5)
        assert runtime.registration.plugin_name == "nri-numa"
        assert runtime.registration.plugin_idx == "90"
    finally:
        daemon.stop()
        worker.join(5)
        sender.stop()
        runtime.close()
        listener.close()
    assert not worker.is_alive()


def test_prelaunched_mode_serves_fd_until_the_runtime_closes_it(scratch):
    topology, config = agent_files(scratch)
    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end).start()
    created: list[api.CreateContainerResponse] = []

    def runtime_side() -> None:
        runtime.registered.wait(5)
        runtime.configure()
        sandbox = msg.pod("g")
        created.append(runtime.call("CreateContainer",
                                    msg.create(sandbox, msg.guaranteed(sandbox, "a", 2)),
                                    api.CreateContainerResponse))
        runtime.close()  # containerd stops: the launched plugin sees EOF and ends

    side = threading.Thread(target=runtime_side, daemon=True)
    side.start()
    options = d.DaemonOptions(state_dir=scratch / "state", topology_file=topology,
                              config_file=config)
    d.run(options, environ={"NRI_PLUGIN_SOCKET": str(plugin_end.detach()),
                            "NRI_PLUGIN_NAME": "numa", "NRI_PLUGIN_IDX": "05"})
    side.join(5)
    assert (runtime.registration.plugin_name, runtime.registration.plugin_idx) == ("numa", "05")
    assert len(created) == 1 and created[0].adjust.linux.resources.cpu.cpus
    assert (scratch / "state" / "checkpoint.json").exists()


@pytest.mark.parametrize("setup, message", [
    (lambda s: (s / "node.json").write_text("{"), "node.json: topology is not JSON"),
    (lambda s: (s / "config.yaml").write_text("topologyManagerPolicy: nope\n"),
     "config.yaml: topologyManagerPolicy: 'nope' is not one of"),
    (lambda s: (s / "config.yaml").write_text("a: [\n"), "config.yaml: not valid YAML"),
    (lambda s: (s / "config.yaml").unlink(), "cannot read config file"),
    (lambda s: (s / "config.yaml").write_text("cpuManagerPolicy: static\nreservedSystemCPUs: '99'\n"),
     "not all reserved cpus"),
])
def test_start_up_problems_are_named(scratch, setup, message):
    topology, config = agent_files(scratch)
    setup(scratch)
    options = d.DaemonOptions(state_dir=scratch / "state", topology_file=topology,
                              config_file=config)
    with pytest.raises(d.DaemonError, match=message):
        d.run(options, environ={"NRI_PLUGIN_SOCKET": "not-a-number"})


def test_a_second_agent_on_the_same_state_folder_is_refused(scratch):
    topology, config = agent_files(scratch)
    options = d.DaemonOptions(state_dir=scratch / "state", topology_file=topology,
                              config_file=config)
    held = d.CheckpointStore(scratch / "state", "any")
    held.lock()
    try:
        with pytest.raises(d.DaemonError, match="in use by another nri-numa"):
            d.run(options, environ={})
    finally:
        held.unlock()


def test_bad_prelaunch_socket_is_named(scratch):
    topology, config = agent_files(scratch)
    options = d.DaemonOptions(state_dir=scratch / "state", topology_file=topology,
                              config_file=config)
    with pytest.raises(d.DaemonError, match="NRI_PLUGIN_SOCKET='3x' is not a file descriptor"):
        d.run(options, environ={"NRI_PLUGIN_SOCKET": "3x"})
    with pytest.raises(d.DaemonError, match="is not an open socket"):
        d.run(options, environ={"NRI_PLUGIN_SOCKET": "987"})


def test_sigterm_stops_the_agent_cleanly(scratch):
    topology, config = agent_files(scratch)
    log_file = scratch / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "nri_numa", "run", "--nri-socket", str(scratch / "absent.sock"),
         "--state-dir", str(scratch / "state"), "--topology", str(topology),
         "--config", str(config), "--log-file", str(log_file)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        until(lambda: log_file.exists() and "attempt 2" in log_file.read_text(), 20)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(10) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    text = log_file.read_text()
    assert "cannot connect to the NRI socket" in text and "nri-numa stopped" in text


def test_run_help_states_the_daemons_defaults():
    run_parser = build_parser()._subparsers._group_actions[0].choices["run"]
    text = run_parser.format_help().replace("\n", " ")
    defaults = d.DaemonOptions()
    for value in (defaults.socket_path, str(defaults.state_dir), defaults.name, defaults.index):
        assert f"(default {value})" in " ".join(text.split())


# --- packaging --------------------------------------------------------------------------------


def test_the_example_config_is_valid_and_fits_a_real_layout():
    from nri_numa.engine.context import EngineContext
    from nri_numa.topology.synthetic import preset_topology

    config = d.load_config(REPO / "packaging" / "nri-numa.conf.example")
    assert str(config.topology_manager_policy) == "single-numa-node"
    EngineContext.build(preset_topology("intel-2s-ht"), config)


def test_the_containerd_snippet_turns_nri_on_at_the_default_socket():
    import tomllib

    snippet = tomllib.loads((REPO / "packaging" / "containerd-1.7-nri.toml").read_text())
    nri = snippet["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == d.DEFAULT_SOCKET


def test_the_unit_runs_a_command_the_cli_accepts():
    lines = (REPO / "packaging" / "nri-numa.service").read_text().replace("\\\n", " ").splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    argv = exec_start.removeprefix("ExecStart=").split()
    assert argv[0].endswith("/nri-numa")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.nri_socket == d.DEFAULT_SOCKET
    assert args.state_dir == d.DEFAULT_STATE_DIR


def test_a_bad_plugin_index_stops_the_agent_instead_of_retrying():
    connect = Runtimes(failures=0)
    sender = d.UpdateSender()
    daemon = d.Daemon(new_plugin(), sender, d.DaemonOptions(index="9"), connect=connect,
                      delays=iter(lambda: 0.01, None))
    try:
        with pytest.raises(d.DaemonError, match="invalid plugin index '9'"):
            daemon.run_external()
    finally:
        sender.stop()
        for runtime in connect.runtimes:
            runtime.close()
    assert connect.attempts == 1
