"""End to end through the NRI wire: ``nri-numa run --pod-resources-socket`` with the fake kubelet
(``python -m nri_numa.podresources.fake_server``) and the fake runtime on real unix sockets. The
runtime shows no device (NVIDIA's hook adds the GPU after NRI); the kubelet says which GPU the
container got, and its CPUs and memory follow it to node 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.cli import build_parser
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri import daemon as d
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.podresources import DEFAULT_SOCKET
from nri_numa.podresources.fake_server import FakeKubelet
from nri_numa.podresources.fake_state import state_from_mapping
from nri_numa.podresources.source import KubeletDeviceHints, hint_source
from nri_numa.topology.cpulist import parse_list
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime
from tests.integration.nri.plugin_env import CONFIG, GPU_ON_NODE_1, machine, new_plugin

REPO = Path(__file__).resolve().parents[3]
GPU = "nvidia.com/gpu"
NODE_0, NODE_1 = frozenset(range(0, 4)), frozenset(range(4, 8))

STATE = f"""
pods:
  - namespace: ml
    name: trainer
    containers:
      - name: main
        devices: [{{resource: {GPU}, ids: [{GPU_ON_NODE_1}], numa: [1]}}]
  - namespace: ml
    name: no-topology
    containers:
      - name: main
        devices: [{{resource: {GPU}, ids: [{GPU_ON_NODE_1}]}}]
  - namespace: ml
    name: plain
    containers: [{{name: main}}]
"""


def placed(reply: api.CreateContainerResponse) -> tuple[frozenset[int], str]:
    cpu = reply.adjust.linux.resources.cpu
    return parse_list(cpu.cpus), cpu.mems


def test_nri_numa_run_places_containers_next_to_the_kubelets_gpus(scratch: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    (scratch / "state.yaml").write_text(STATE)
    (scratch / "node.json").write_text(machine().to_json())
    (scratch / "config.yaml").write_text("".join(f"{k}: {v!r}\n" for k, v in CONFIG.items()))
    kubelet_sock, nri_sock, log = scratch / "kubelet.sock", scratch / "nri.sock", scratch / "agent.log"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(nri_sock))
    listener.listen(1)
    listener.settimeout(30)
    kubelet = subprocess.Popen(
        [sys.executable, "-m", "nri_numa.podresources.fake_server", "--socket", str(kubelet_sock),
         "--state", str(scratch / "state.yaml")], cwd=REPO, env=env, stderr=subprocess.PIPE)
    assert b"serving" in kubelet.stderr.readline()  # before the agent starts: it warms up
    agent = subprocess.Popen(
        [sys.executable, "-m", "nri_numa", "run", "--nri-socket", str(nri_sock),
         "--pod-resources-socket", str(kubelet_sock), "--state-dir", str(scratch / "state"),
         "--topology", str(scratch / "node.json"), "--config", str(scratch / "config.yaml"),
         "--log-file", str(log), "--log-level", "debug"], cwd=REPO, env=env)
    runtime = None
    try:
        runtime = FakeRuntime(listener.accept()[0]).start()
        assert runtime.registered.wait(30)
        runtime.configure()
        runtime.synchronize()
        replies = {}
        for name in ("trainer", "no-topology", "plain"):
            sandbox = msg.pod(name, namespace="ml")
            replies[name] = placed(runtime.call(
                "CreateContainer", msg.create(sandbox, msg.guaranteed(sandbox, "main", 2)),
                api.CreateContainerResponse, timeout=5))
        cpus, mems = replies["trainer"]
        assert len(cpus) == 2 and cpus <= NODE_1 and mems == "", log.read_text()  # memory left alone
        cpus, mems = replies["no-topology"]  # the GPU's UUID, found in the machine's topology
        assert len(cpus) == 2 and cpus <= NODE_1 and mems == ""
        cpus, mems = replies["plain"]  # no devices: where the engine puts it without hints
        assert len(cpus) == 2 and cpus <= NODE_0 and mems == ""
    finally:
        if runtime is not None:
            runtime.close()
        listener.close()
        for process in (agent, kubelet):
            process.terminate()
        assert agent.wait(10) == 0 and kubelet.wait(10) == 0
    text = log.read_text()
    assert f"using the kubelet's PodResources API at {kubelet_sock}" in text
    assert "hint NUMA 1 (preferred)" in text


# --- the same decisions in process, for what the subprocess cannot show ------------------------


@pytest.fixture
def kubelet(scratch: Path) -> Iterator[FakeKubelet]:
    state = state_from_mapping({"pods": [{"namespace": "default", "name": "p", "containers": [
        {"name": "main", "devices": [{"resource": GPU, "ids": ["any"], "numa": [0]}]}]}]})
    with FakeKubelet(scratch / "kubelet.sock", state) as server:
        yield server


def test_the_kubelets_word_wins_over_the_runtimes_for_the_same_resource(kubelet) -> None:
    # The spec names the node-1 GPU (NVIDIA_VISIBLE_DEVICES); the kubelet says the container's
    # GPU is on node 0. The kubelet chose the devices, so node 0.
    plugin = new_plugin()
    plugin_with = NumaPlugin(machine(), config_from_mapping(CONFIG),
                             kubelet_hints=KubeletDeviceHints(str(kubelet.socket_path), machine(),
                                                              budget_s=10.0))
    sandbox = msg.pod("p")
    container = msg.guaranteed(sandbox, "main", 2, env=[f"NVIDIA_VISIBLE_DEVICES={GPU_ON_NODE_1}"])
    cpus, mems = placed(plugin.create_container(msg.create(sandbox, container)))
    assert cpus <= NODE_1 and mems == ""  # the runtime's hint alone
    cpus, mems = placed(plugin_with.create_container(msg.create(sandbox, container)))
    assert cpus <= NODE_0 and mems == ""
    assert kubelet.calls == ["Get"]


def test_the_flag_defaults_to_the_kubelets_socket_and_empty_turns_it_off() -> None:
    parser = build_parser()
    assert build_parser().parse_args(["run"]).pod_resources_socket is None
    assert d.DaemonOptions().pod_resources_socket == DEFAULT_SOCKET
    run_help = "".join(parser._subparsers._group_actions[0].choices["run"].format_help().split())
    assert f"(default{DEFAULT_SOCKET};" in run_help  # argparse wraps lines at the dashes
    args = parser.parse_args(["run", "--pod-resources-socket", ""])
    assert args.pod_resources_socket == "" and hint_source("", machine()) is None
    assert isinstance(hint_source(DEFAULT_SOCKET, machine()), KubeletDeviceHints)


def test_a_synchronize_asks_the_kubelet_once_for_all_its_containers(kubelet) -> None:
    # Two running containers the plugin did not place, on every CPU: adopting them needs the
    # kubelet's word on their devices, and one List answers for both (one_list()).
    state = state_from_mapping({"pods": [
        {"namespace": "default", "name": f"p{i}", "containers": [
            {"name": "main", "devices": [{"resource": GPU, "ids": [GPU_ON_NODE_1], "numa": [1]}]}]}
        for i in range(2)]})
    kubelet.state = state
    plugin = NumaPlugin(machine(), config_from_mapping(CONFIG),
                        kubelet_hints=KubeletDeviceHints(str(kubelet.socket_path), machine(),
                                                         budget_s=10.0))
    sandboxes = [msg.pod(f"p{i}") for i in range(2)]
    containers = []
    for i, sandbox in enumerate(sandboxes):
        c = msg.guaranteed(sandbox, "main", 1, cid=f"running-{i}")
        c.state, c.pid = api.CONTAINER_RUNNING, 100 + i
        c.linux.resources.cpu.cpus = "0-7"
        containers.append(c)
    plugin.synchronize(api.SynchronizeRequest(pods=sandboxes, containers=containers))
    for c in containers:
        assert plugin.containers[c.id].cpus <= NODE_1, plugin.containers[c.id]
    assert kubelet.calls == ["List"]
    # A container created afterwards is asked about afresh.
    sandbox = msg.pod("p1")
    placed(plugin.create_container(msg.create(sandbox, msg.guaranteed(sandbox, "main", 1))))
    assert kubelet.calls == ["List", "Get"]
