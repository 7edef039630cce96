"""The kubelet's CPU and Memory Manager checkpoints at the first Synchronize: running containers
keep the CPUs and memory the kubelet gave them (nri_numa.nri.sync.adopt's kubelet_cpus and
kubelet_memory), checked as any adoption is; what fails the checks is logged per container and
placed anew."""

from __future__ import annotations

import logging

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.kubelet_checkpoints import (KubeletCpuState, KubeletMemoryState,
                                                KubeletPlacements, MemoryBlock)
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, CONFIG, GIB, Sent, cpusets, machine


STATIC_MEMORY = {"memoryManagerPolicy": "Static",
                 "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                                    {"numaNode": 1, "limits": {"memory": "1Gi"}}]}


def kubelet_state(**assignments: frozenset[int]) -> KubeletPlacements:
    """``pod name=CPUs``: container "app" of pod uid-<name> holds those CPUs."""
    given = {(f"uid-{pod}", "app"): cpus for pod, cpus in assignments.items()}
    default = frozenset(range(8)) - frozenset().union(*given.values())
    return KubeletPlacements(KubeletCpuState("static", default, given, "v2"))


def kubelet_memory(cpus: KubeletPlacements | None = None,
                   **nodes: tuple[int, ...]) -> KubeletPlacements:
    """``pod name=NUMA nodes``: container "app" of pod uid-<name> holds its 1 GiB there."""
    given = {(f"uid-{pod}", "app"): (MemoryBlock(frozenset(on), "memory", GIB),)
             for pod, on in nodes.items()}
    return KubeletPlacements(cpus.cpu if cpus else None, KubeletMemoryState("Static", given))


def synchronize(plugin: NumaPlugin, *pods_containers) -> api.SynchronizeResponse:
    pods = [p for p, _ in pods_containers]
    containers = [c for _, c in pods_containers]
    for c in containers:
        c.state = api.CONTAINER_RUNNING
        c.pid = 42
    return plugin.synchronize(api.SynchronizeRequest(pods=pods, containers=containers))


def plugin_with(kubelet: KubeletPlacements | None, **config) -> NumaPlugin:
    return NumaPlugin(machine(), config_from_mapping({**CONFIG, **config}), send_updates=Sent(),
                      kubelet_state=kubelet)


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
    plugin._kubelet_state.cpu.assignments[("uid-e", "app")] = frozenset({5, 6})
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
    assert plugin._kubelet_state is None


def test_without_a_checkpoint_the_engine_places_them():
    plugin = plugin_with(None)
    a = guaranteed("a", 2)
    synchronize(plugin, a)
    assert plugin.containers[a[1].id].cpus != {5, 6}


def test_v1_entries_are_found_by_container_id():
    a = guaranteed("a", 2)
    state = KubeletCpuState("static", frozenset(range(5)) | {7}, {("", a[1].id): frozenset({5, 6})},
                            "v1")
    plugin = plugin_with(KubeletPlacements(state))
    synchronize(plugin, a)
    assert plugin.containers[a[1].id].cpus == {5, 6}


def test_running_containers_keep_the_kubelets_memory_and_cpus_follow_it(caplog):
    # a: memory on node 1 and no CPUs in the CPU checkpoint: its CPUs come from node 1.
    # b: memory on node 0 with the kubelet's CPUs 2-3 (node 0): both kept.
    plugin = plugin_with(kubelet_memory(kubelet_state(b=frozenset({2, 3})), a=(1,), b=(0,)),
                         **STATIC_MEMORY)
    a, b = guaranteed("a", 2), guaranteed("b", 2)
    with caplog.at_level(logging.INFO, "nri_numa.nri.plugin"):
        reply = synchronize(plugin, a, b)
    assert plugin.containers[a[1].id].mems == {1} and plugin.containers[a[1].id].cpus <= {4, 5, 6, 7}
    assert plugin.containers[b[1].id].mems == {0} and plugin.containers[b[1].id].cpus == {2, 3}
    memory = plugin.ledger.allocations.memory
    assert memory.nodes[1].tables["memory"].reserved == GIB  # counted: not given twice
    assert memory.nodes[0].tables["memory"].reserved == GIB
    assert cpusets(reply.update)[b[1].id] == "2-3"
    assert "running pod default/a container app keeps the kubelet's memory 1Gi on NUMA nodes 1" \
        in caplog.text


def test_memory_that_fails_the_checks_is_a_warning_and_placed_anew(caplog):
    big = kubelet_memory(a=(1,), b=(7,), c=(0, 1))
    big.memory.assignments[("uid-d", "app")] = (MemoryBlock(frozenset({0}), "memory", 3 * GIB),)
    plugin = plugin_with(big, **STATIC_MEMORY)
    pods = [guaranteed(name, 1) for name in "abcd"]
    with caplog.at_level(logging.WARNING, "nri_numa.nri.plugin"):
        synchronize(plugin, *pods)
    assert plugin.containers[pods[0][1].id].mems == {1}  # a: kept
    for name, why in (("b", "not this machine's"), ("c", "used by other containers alone or in another group"),
                      ("d", "not one mask holding what the container asks for")):
        line = next(r.getMessage() for r in caplog.records if f"pod default/{name} " in r.getMessage())
        assert "placed anew" in line and why in line, line
    for _, c in pods[1:]:  # placed by the engine: memory on the CPUs' one node
        record = plugin.containers[c.id]
        assert record.mems is not None and len(record.mems) == 1


def test_without_the_static_memory_manager_the_kubelets_memory_is_a_warning(caplog):
    plugin = plugin_with(kubelet_memory(a=(1,)))
    a = guaranteed("a", 1)
    with caplog.at_level(logging.WARNING, "nri_numa.nri.plugin"):
        synchronize(plugin, a)
    assert plugin.containers[a[1].id].mems is None  # left alone, as the engine leaves them
    assert "memoryManagerPolicy None" in caplog.text
