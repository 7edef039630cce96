"""PostStartContainer: a cpuset update that reached only the spec of a starting container is
sent again once it runs (nri_numa.nri.start_check), found from the creation or from its cgroup."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nri_numa.agent.metrics import PluginMetrics
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.runtime.cpuset_cgroups import cgroup_path_of
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, CONFIG, Sent, cpusets, create, machine

SHARED_WITHOUT_1 = "0,2-7"


def plugin_with(sent: Sent, cgroup_root: Path | None = None,
                metrics: PluginMetrics | None = None) -> NumaPlugin:
    kwargs = {} if metrics is None else {"metrics": metrics}
    return NumaPlugin(machine(), config_from_mapping(CONFIG), send_updates=sent,
                      cgroup_root=cgroup_root, **kwargs)


def post_start(plugin: NumaPlugin, sandbox: api.PodSandbox, container: api.Container,
               cgroups_path: str = "") -> None:
    event = msg.event(api.POST_START_CONTAINER, sandbox, container)
    event.container.linux.cgroups_path = cgroups_path
    plugin.state_change(event)


def besteffort_then_guaranteed(plugin: NumaPlugin):
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be = msg.container(be_pod, "app")
    assert create(plugin, be_pod, be).adjust.linux.resources.cpu.cpus == ALL
    reply = create(plugin, g_pod, msg.guaranteed(g_pod, "app", cpus=1))
    assert cpusets(reply.update) == {be.id: SHARED_WITHOUT_1}  # the update a start can miss
    return be_pod, be


def test_a_container_whose_cpuset_changed_while_it_started_gets_it_again(caplog):
    sent = Sent()
    plugin = plugin_with(sent, metrics=(metrics := PluginMetrics(lambda: (plugin.ledger, {}))))
    be_pod, be = besteffort_then_guaranteed(plugin)
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        post_start(plugin, be_pod, be)
    [[update]] = sent.batches
    assert update.container_id == be.id and update.ignore_failure
    assert update.linux.resources.cpu.cpus == SHARED_WITHOUT_1
    assert update.linux.resources.cpu.mems == ""  # a shared container's memory stays alone
    assert "repaired pod default/be container app: cpus 0,2-7 sent again (changed while it " \
           "started)" in caplog.text
    assert metrics.registry.get_sample_value("nri_numa_cpuset_repairs_total") == 1
    post_start(plugin, be_pod, be)  # a second PostStart (none comes, but it costs nothing)
    assert len(sent.batches) == 1


def test_a_container_started_on_the_cpuset_it_was_created_with_gets_nothing():
    sent = Sent()
    plugin = plugin_with(sent)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be, g = msg.container(be_pod, "app"), msg.guaranteed(g_pod, "app", cpus=1)
    create(plugin, be_pod, be)
    post_start(plugin, be_pod, be)
    create(plugin, g_pod, g)  # after be started: its update reaches the cgroup
    post_start(plugin, g_pod, g)
    assert sent.batches == []


def test_a_cpuset_changed_and_changed_back_before_the_start_needs_nothing():
    sent = Sent()
    plugin = plugin_with(sent)
    be_pod, be = besteffort_then_guaranteed(plugin)
    plugin.state_change(msg.event(api.REMOVE_POD_SANDBOX, msg.pod("g"), None))
    assert cpusets(sent.batches.pop()) == {be.id: ALL}
    post_start(plugin, be_pod, be)
    assert sent.batches == []


def test_a_released_container_is_forgotten():
    sent = Sent()
    plugin = plugin_with(sent)
    be_pod, be = besteffort_then_guaranteed(plugin)
    plugin.state_change(msg.event(api.REMOVE_CONTAINER, be_pod, be))
    post_start(plugin, be_pod, be)
    assert sent.batches == []
    assert plugin._starts._created.keys() == {"ctr-g-app"}


def cgroup_tree(root: Path, path: str, cpus: str, mems: str = "0-1") -> None:
    """A cgroup v2 hierarchy with one container's cgroup at ``path``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu memory\n")
    folder = root / path.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "cpuset.cpus").write_text(cpus + "\n")
    (folder / "cpuset.mems").write_text(mems + "\n")


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_a_cgroup_that_differs_from_the_ledger_is_repaired(tmp_path, driver, caplog):
    sent = Sent()
    plugin = plugin_with(sent, tmp_path / "cgroup")
    be_pod = msg.pod("be", "besteffort", driver=driver)
    be = msg.container(be_pod, "app")
    create(plugin, be_pod, be)
    plugin._starts.forget([be.id])  # nothing to compare with: adopted, or the agent restarted
    parent = be_pod.linux.cgroup_parent
    cgroups_path = f"{parent}/{be.id}" if driver == "cgroupfs" else f"{parent}:cri-containerd:{be.id}"
    cgroup_tree(tmp_path / "cgroup", cgroup_path_of(cgroups_path), "0-3")
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        post_start(plugin, be_pod, be, cgroups_path)
    assert [cpusets(batch) for batch in sent.batches] == [{be.id: ALL}]
    assert "(its cgroup differed after it started)" in caplog.text


def test_a_cgroup_that_matches_is_left_alone(tmp_path):
    sent = Sent()
    plugin = plugin_with(sent, tmp_path / "cgroup")
    be_pod = msg.pod("be", "besteffort")
    be = msg.container(be_pod, "app")
    create(plugin, be_pod, be)
    path = f"{be_pod.linux.cgroup_parent}/{be.id}"
    cgroup_tree(tmp_path / "cgroup", path, ALL)
    post_start(plugin, be_pod, be, path)
    assert sent.batches == []


def test_no_cgroup_to_read_is_no_repair(tmp_path):
    sent = Sent()
    plugin = plugin_with(sent, tmp_path / "no-cgroups-here")
    be_pod = msg.pod("be", "besteffort")
    be = msg.container(be_pod, "app")
    create(plugin, be_pod, be)
    post_start(plugin, be_pod, be, f"{be_pod.linux.cgroup_parent}/{be.id}")
    post_start(plugin, be_pod, be, "not a cgroups path")
    assert sent.batches == []


@pytest.mark.parametrize("given, path", [
    ("/kubepods/besteffort/pod1/abc", "/kubepods/besteffort/pod1/abc"),
    ("kubepods-besteffort-pod1.slice:cri-containerd:abc",
     "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
     "cri-containerd-abc.scope"),
    ("system.slice:crio:abc", "/system.slice/crio-abc.scope"),
    ("", None), ("relative/path", None), ("a:b", None), ("pod.slice::abc", None),
    ("notaslice:cri-containerd:abc", None),
])
def test_cgroup_path_of(given, path):
    assert cgroup_path_of(given) == path


def test_synchronize_repairs_a_running_container_whose_cgroup_missed_an_update(tmp_path, caplog):
    """After a restart the spec can be right while the cgroup is not: Synchronize reads it."""
    be_pod = msg.pod("be", "besteffort")
    be = msg.container(be_pod, "app")
    sent = Sent()
    plugin = plugin_with(sent, tmp_path / "cgroup")
    create(plugin, be_pod, be)
    path = f"{be_pod.linux.cgroup_parent}/{be.id}"
    cgroup_tree(tmp_path / "cgroup", path, "0-3")
    running = msg.container(be_pod, "app", cpus=ALL, state=api.CONTAINER_RUNNING, pid=42)
    running.linux.cgroups_path = path
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        reply = plugin.synchronize(api.SynchronizeRequest(pods=[be_pod], containers=[running]))
    assert cpusets(reply.update) == {be.id: ALL}
    assert "(its cgroup differed at Synchronize)" in caplog.text
    (tmp_path / "cgroup" / path.lstrip("/") / "cpuset.cpus").write_text(ALL)
    reply = plugin.synchronize(api.SynchronizeRequest(pods=[be_pod], containers=[running]))
    assert not reply.update
