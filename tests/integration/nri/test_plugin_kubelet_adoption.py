"""The kubelet's CPU Manager checkpoint at the first Synchronize: running containers keep the
CPUs the kubelet gave them (nri_numa.nri.sync.adopt's kubelet_cpus), checked as any adoption
is; CPUs that fail the checks are logged per container and the container is placed anew."""

from __future__ import annotations

import logging

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.kubelet_checkpoints import KubeletCpuState
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, CONFIG, Sent, cpusets, machine


def kubelet_state(**assignments: frozenset[int]) -> KubeletCpuState:
    """``pod name=CPUs``: container "app" of pod uid-<name> holds those CPUs."""
    given = {(f"uid-{pod}", "app"): cpus for pod, cpus in assignments.items()}
    default = frozenset(range(8)) - frozenset().union(*given.values())
    return KubeletCpuState("static", default, given, "v2")


def synchronize(plugin: NumaPlugin, *pods_containers) -> api.SynchronizeResponse:
    pods = [p for p, _ in pods_containers]
    containers = [c for _, c in pods_containers]
    for c in containers:
        c.state = api.CONTAINER_RUNNING
        c.pid = 42
    return plugin.synchronize(api.SynchronizeRequest(pods=pods, containers=containers))


def plugin_with(kubelet: KubeletCpuState | None) -> NumaPlugin:
    return NumaPlugin(machine(), config_from_mapping(CONFIG), send_updates=Sent(),
                      kubelet_cpus=kubelet)


def guaranteed(name: str, cpus: int, shown: str = ALL):
    pod = msg.pod(name)
    return pod, msg.container(pod, "app", cpu=cpus * 1000, cpu_limit=cpus * 1000,
                              memory=1 << 30, cpus=shown)


def test_running_containers_keep_the_kubelets_cpus(caplog):
    plugin = plugin_with(kubelet_state(a=frozenset({5, 6}), b=frozenset({2})))
    a, b = guaranteed("a", 2), guaranteed("b", 1)
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        reply = synchronize(plugin, a, b)
    assert plugin.containers[a[1].id].cpus == {5, 6}
    assert plugin.containers[b[1].id].cpus == {2}
    assert cpusets(reply.update)[a[1].id] == "5-6"  # the runtime showed 0-7: set to the kubelet's
    assert "adopted pod default/a container app on the kubelet's CPUs 5-6" in caplog.text


def test_cpus_that_fail_the_checks_are_a_warning_and_a_new_placement(caplog):
    # a: the reserved CPU 0; b: as many as asked but CPU 9 is not on this machine;
    # c: CPUs 5-6 that a already holds; d: one CPU for a container asking for two
    plugin = plugin_with(kubelet_state(a=frozenset({0, 1}), b=frozenset({9}),
                                       c=frozenset({5, 6}), d=frozenset({3})))
    plugin._kubelet_cpus.assignments[("uid-e", "app")] = frozenset({5, 6})
    pods = [guaranteed("a", 2), guaranteed("b", 1), guaranteed("e", 2), guaranteed("c", 2),
            guaranteed("d", 2)]
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        synchronize(plugin, *pods)
    held = [plugin.containers[c.id].cpus for _, c in pods]
    assert held[2] == {5, 6}  # e came first with 5-6
    assert not plugin.containers[pods[4][1].id].exclusive  # d: nothing left; shared pool
    for name in "abcd":
        assert (f"running pod default/{name} container app: the kubelet's checkpoint gives it "
                in caplog.text)
    exclusive = [plugin.containers[c.id].cpus for _, c in pods
                 if plugin.containers[c.id].exclusive]
    assert sum(len(c) for c in exclusive) == len(frozenset().union(*exclusive))  # none shared
    assert not frozenset().union(*exclusive) & {0}


def test_only_the_first_synchronize_uses_the_checkpoint():
    plugin = plugin_with(kubelet_state(a=frozenset({5, 6})))
    synchronize(plugin)
    a = guaranteed("a", 2)
    synchronize(plugin, a)
    assert plugin.containers[a[1].id].cpus != {5, 6}  # placed by the engine
    assert plugin._kubelet_cpus is None


def test_without_a_checkpoint_the_engine_places_them():
    plugin = plugin_with(None)
    a = guaranteed("a", 2)
    synchronize(plugin, a)
    assert plugin.containers[a[1].id].cpus != {5, 6}


def test_v1_entries_are_found_by_container_id():
    a = guaranteed("a", 2)
    state = KubeletCpuState("static", frozenset(range(5)) | {7}, {("", a[1].id): frozenset({5, 6})},
                            "v1")
    plugin = plugin_with(state)
    synchronize(plugin, a)
    assert plugin.containers[a[1].id].cpus == {5, 6}
