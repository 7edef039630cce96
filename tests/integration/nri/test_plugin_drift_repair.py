"""The drift repair (nri_numa.nri.drift_repair): a started container whose cgroup no longer holds
the ledger's cpuset gets it again at the next periodic check, logged and counted; the period is
the kubelet's cpuManagerReconcilePeriod."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from nri_numa.agent.metrics import PluginMetrics
from nri_numa.engine.config import ConfigError
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.drift_repair import DriftRepair
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, CONFIG, Sent, cpusets, create, machine
from tests.integration.nri.test_plugin_start_check import cgroup_tree, post_start


def started(tmp_path: Path, metrics: bool = False):
    """A plugin over a cgroup v2 tree, with a Guaranteed container (CPU 1) and a BestEffort
    one, both started, their cgroups as the ledger says."""
    root = tmp_path / "cgroup"
    sent = Sent()
    kwargs = {"metrics": PluginMetrics(lambda: (plugin.ledger, {}))} if metrics else {}
    plugin = NumaPlugin(machine(), config_from_mapping(CONFIG), send_updates=sent,
                        cgroup_root=root, **kwargs)
    g_pod, be_pod = msg.pod("g"), msg.pod("be", "besteffort")
    g, be = msg.guaranteed(g_pod, "app", cpus=1), msg.container(be_pod, "app")
    paths = {}
    for pod, container in ((g_pod, g), (be_pod, be)):
        path = f"{pod.linux.cgroup_parent}/{container.id}"
        container.linux.cgroups_path = path
        create(plugin, pod, container)
        paths[container.id] = path
    exclusive = plugin.containers[g.id].cpus
    shared = plugin.ledger.allocations.shared
    mems = plugin.containers[g.id].mems or frozenset({0, 1})
    cgroup_tree(root, paths[g.id], ",".join(map(str, sorted(exclusive))),
                ",".join(map(str, sorted(mems))))
    cgroup_tree(root, paths[be.id], ",".join(map(str, sorted(shared))))
    for pod, container in ((g_pod, g), (be_pod, be)):
        post_start(plugin, pod, container, paths[container.id])
    assert sent.batches == []
    return plugin, sent, root, paths, g, be


def test_a_cgroup_changed_behind_the_agents_back_is_repaired(tmp_path, caplog):
    plugin, sent, root, paths, g, be = started(tmp_path, metrics=True)
    (root / paths[g.id].lstrip("/") / "cpuset.cpus").write_text(ALL)
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        updates = plugin.reconcile()
    exclusive = plugin.containers[g.id].cpus
    assert cpusets(updates) == {g.id: ",".join(map(str, sorted(exclusive)))}
    assert "(its cgroup differed at the periodic check)" in caplog.text
    assert plugin._metrics.registry.get_sample_value("nri_numa_cpuset_repairs_total") == 1


def test_cgroups_that_match_need_nothing(tmp_path):
    plugin, *_ = started(tmp_path)
    assert plugin.reconcile() == []


def test_a_container_not_started_yet_or_released_is_not_checked(tmp_path):
    plugin, sent, root, paths, g, be = started(tmp_path)
    (root / paths[be.id].lstrip("/") / "cpuset.cpus").write_text("1")
    plugin.state_change(msg.event(api.REMOVE_CONTAINER, msg.pod("be", "besteffort"), be))
    assert plugin.reconcile() == []
    pod = msg.pod("late", "besteffort")
    late = msg.container(pod, "app")
    late.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{late.id}"
    create(plugin, pod, late)
    cgroup_tree(root, late.linux.cgroups_path, "1")  # created, not started: runc still at work
    assert plugin.reconcile() == []


def test_the_loop_sends_the_repair_within_the_period_and_only_when_connected(tmp_path):
    plugin, sent, root, paths, g, be = started(tmp_path)
    (root / paths[be.id].lstrip("/") / "cpuset.cpus").write_text("1")
    connected = threading.Event()
    batches: list[list[api.ContainerUpdate]] = []
    got = threading.Event()

    def send(updates):
        batches.append(updates)
        got.set()
    loop = DriftRepair(plugin.reconcile, send, connected.is_set, lambda: 0.05)
    assert loop.check_once() == 0  # no runtime: nothing checked
    loop.start()
    try:
        connected.set()
        assert got.wait(5)
    finally:
        loop.stop()
    assert be.id in cpusets(batches[0])


def test_a_period_of_zero_checks_nothing(tmp_path):
    calls = []
    loop = DriftRepair(lambda: calls.append(1) or [], lambda u: None, lambda: True, lambda: 0.0)
    loop.start()
    threading.Event().wait(0.2)
    loop.stop()
    assert calls == []


@pytest.mark.parametrize("raw, seconds", [
    ("10s", 10.0), ("1m30s", 90.0), ("500ms", 0.5), ("0", 0.0), ("0s", 0.0), (2, 2.0),
    ("1.5s", 1.5), ("1h", 3600.0)])
def test_the_period_is_read_as_the_kubelet_writes_it(raw, seconds):
    config = config_from_mapping({"cpuManagerReconcilePeriod": raw})
    assert config.cpu_manager_reconcile_period == seconds


def test_the_default_period_is_the_kubelets():
    assert config_from_mapping({}).cpu_manager_reconcile_period == 10.0


@pytest.mark.parametrize("raw", ["10", "ten", "-1s", "25h", "1x", True, None, "s", "1s 2s"])
def test_a_bad_period_is_one_line(raw):
    with pytest.raises(ConfigError) as e:
        config_from_mapping({"cpuManagerReconcilePeriod": raw})
    assert str(e.value).count("\n") == 0 and "cpuManagerReconcilePeriod" in str(e.value)
