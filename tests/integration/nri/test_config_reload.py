"""`nri-numa run` reading its config file again while it runs (issue 14 item 7), as a real
process: SIGHUP switches the log to JSON at once; a policy change while a placed container is
held is refused with the start-up drain message and the old configuration stays; a bad file is
one error line and the agent goes on; --watch-config reads a rewritten file without a signal.
Also a kubelet's own file (item 4): its other keys named in one info line at start."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, create, machine
from tests.tmpfs import fast_tmp

REPO = Path(__file__).resolve().parents[3]
KUBELET_FILE = ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                "evictionHard: {memory.available: 100Mi}\n"
                "staticPodPath: /etc/kubernetes/manifests\n"
                + "".join(f"{k}: {v!r}\n" for k, v in CONFIG.items()))


class Agent:
    """A running `nri-numa run` whose standard error is read line by line."""

    def __init__(self, scratch: Path, *args: str, metrics: tuple[str, ...] = (
            "--metrics-address", "off")) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nri_numa", "run", "--topology", str(scratch / "node.json"),
             "--nri-socket", str(scratch / "absent.sock"), "--state-dir", str(scratch / "state"),
             *metrics, "--config", str(scratch / "config.yaml"), *args],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, "the agent ended"
                continue
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout} s")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        finally:
            self.process.kill()


@pytest.fixture
def scratch(tmp_path: Path):
    with fast_tmp(tmp_path) as base:
        (base / "node.json").write_text(machine().to_json())
        # One container placed under CONFIG, as a run before this one left it.
        topology = machine()
        plugin = NumaPlugin(topology, config_from_mapping(CONFIG),
                            CheckpointStore(base / "state", machine_fingerprint(topology)))
        g = msg.pod("g")
        create(plugin, g, msg.guaranteed(g, "app", cpus=2))
        (base / "config.yaml").write_text(KUBELET_FILE)
        yield base


def test_sighup_applies_log_settings_and_refuses_a_policy_change(scratch):
    agent = Agent(scratch)
    try:
        line = agent.wait_for("KubeletConfiguration keys ignored")
        assert "evictionHard, staticPodPath" in line
        agent.wait_for("connecting to")

        (scratch / "config.yaml").write_text(KUBELET_FILE + "nriNuma:\n  logFormat: json\n")
        agent.process.send_signal(signal.SIGHUP)
        reloaded = json.loads(agent.wait_for("configuration reloaded"))
        assert reloaded["level"] == "info" and "(SIGHUP)" in reloaded["msg"]

        changed = KUBELET_FILE.replace("single-numa-node", "best-effort")
        (scratch / "config.yaml").write_text(changed + "nriNuma:\n  logFormat: json\n")
        agent.process.send_signal(signal.SIGHUP)
        refused = json.loads(agent.wait_for("configuration not reloaded"))
        assert refused["level"] == "error"
        assert ("the configuration changed while "
                f"{scratch / 'state' / 'checkpoint.json'} holds the placements of 1 container: "
                "topologyManagerPolicy 'single-numa-node' → 'best-effort'") in refused["msg"]

        (scratch / "config.yaml").write_text(KUBELET_FILE + "topologyManagerScop: pod\n")
        agent.process.send_signal(signal.SIGHUP)
        bad = json.loads(agent.wait_for("configuration not reloaded"))  # still JSON: kept
        assert "did you mean topologyManagerScope?" in bad["msg"]
        assert agent.process.poll() is None
    finally:
        assert agent.stop() == 0


def test_watch_config_reads_a_rewritten_file(scratch):
    agent = Agent(scratch, "--watch-config")
    try:
        agent.wait_for("watching")
        (scratch / "config.yaml").write_text(KUBELET_FILE + "nriNuma:\n  logFormat: json\n")
        reloaded = json.loads(agent.wait_for("configuration reloaded"))
        assert "(the file changed)" in reloaded["msg"]
    finally:
        assert agent.stop() == 0


def test_settings_that_need_a_restart_are_named(scratch):
    agent = Agent(scratch)
    try:
        agent.wait_for("connecting to")
        (scratch / "config.yaml").write_text(KUBELET_FILE + "nriNuma:\n  pluginIndex: 42\n")
        agent.process.send_signal(signal.SIGHUP)
        line = agent.wait_for("configuration reloaded")
        assert "pluginIndex will change at the next start" in line
    finally:
        assert agent.stop() == 0


def test_sighup_moves_and_stops_the_metrics_server(scratch):
    import urllib.error
    import urllib.request

    def scrape(url: str) -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    any_port = KUBELET_FILE + "nriNuma:\n  metricsAddress: 127.0.0.1:0\n"
    (scratch / "config.yaml").write_text(any_port)
    agent = Agent(scratch, metrics=())
    try:
        first = agent.wait_for("metrics served on").split("metrics served on ")[1].strip()
        assert "nri_numa_" in scrape(first)
        (scratch / "config.yaml").write_text(KUBELET_FILE + "nriNuma:\n  metricsAddress: 'off'\n")
        agent.process.send_signal(signal.SIGHUP)
        agent.wait_for("configuration reloaded")
        with pytest.raises(urllib.error.URLError):
            scrape(first)
        (scratch / "config.yaml").write_text(any_port)
        agent.process.send_signal(signal.SIGHUP)
        second = agent.wait_for("metrics served on").split("metrics served on ")[1].strip()
        agent.wait_for("configuration reloaded")
        assert "nri_numa_" in scrape(second)
    finally:
        assert agent.stop() == 0
