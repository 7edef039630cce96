"""The plugin on a machine with isolated CPUs, discovered from a sysfs tree that says so
(/sys/devices/system/cpu/isolated): shared containers never get them, exclusive containers
only when they ask."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from nri_numa.agent.metrics import PluginMetrics
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import PluginError
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.discover import discover
from nri_numa.topology.synthetic import MachineSpec, build_topology, write_tree
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, cpusets, create

ISOLATED = frozenset({2, 3, 7})  # node 0 holds CPUs 0-3, node 1 holds 4-7; CPU 0 is reserved
SHARED = "0-1,4-6"


@pytest.fixture
def plugin(tmp_path, state_dir):
    root = tmp_path / "machine"
    root.mkdir()
    write_tree(build_topology(MachineSpec(name="iso", sockets=1, nodes_per_socket=2,
                                          cores_per_node=4, threads_per_core=1,
                                          isolcpus=ISOLATED)), root)
    assert (root / "sys/devices/system/cpu/isolated").read_text().strip() == "2-3,7"
    topology = discover(root, nvml=False)
    assert topology.isolcpus == ISOLATED
    store = CheckpointStore(state_dir, machine_fingerprint(topology))
    return NumaPlugin(topology, config_from_mapping(CONFIG), store)


def cpus_of(reply: api.CreateContainerResponse) -> frozenset[int]:
    return parse_list(reply.adjust.linux.resources.cpu.cpus)


def test_shared_containers_never_run_on_isolated_cpus(plugin):
    be_pod, burst_pod = msg.pod("be", "besteffort"), msg.pod("b", "burstable")
    assert create(plugin, be_pod, msg.container(be_pod, "app")).adjust.linux.resources.cpu.cpus \
        == SHARED
    reply = create(plugin, burst_pod, msg.container(burst_pod, "app", cpu=500))
    assert reply.adjust.linux.resources.cpu.cpus == SHARED


def test_guaranteed_without_the_annotation_gets_no_isolated_cpu(plugin):
    g_pod = msg.pod("g")
    assert not cpus_of(create(plugin, g_pod, msg.guaranteed(g_pod, "app", cpus=3))) & ISOLATED


def test_require_on_the_pod_gives_isolated_cpus_and_leaves_the_shared_pool(plugin):
    be_pod = msg.pod("be", "besteffort")
    create(plugin, be_pod, msg.container(be_pod, "app"))
    iso_pod = msg.pod("iso", annotations={"numa.nri.io/isolated-cpus": "require"})
    iso = msg.guaranteed(iso_pod, "app", cpus=2)
    reply = create(plugin, iso_pod, iso)
    assert cpus_of(reply) == {2, 3}
    assert not reply.update  # the shared pool did not change: nobody else is moved
    stop = plugin.stop_container(api.StopContainerRequest(pod=iso_pod, container=iso))
    assert cpusets(stop.update) == {}  # the freed isolated CPUs do not join the pool
    assert plugin.ledger.allocations.shared == parse_list(SHARED)


def test_the_containers_own_annotation_asks_for_it(plugin):
    g_pod = msg.pod("g")
    c = msg.guaranteed(g_pod, "app", cpus=1)
    c.annotations["numa.nri.io/isolated-cpus"] = "require"
    assert cpus_of(create(plugin, g_pod, c)) == {2}  # without it: CPU 1, the first free one


def test_require_that_cannot_be_met_is_refused_with_the_reason(plugin):
    iso_pod = msg.pod("iso", annotations={"numa.nri.io/isolated-cpus.app": "require"})
    before = plugin.ledger.allocations
    with pytest.raises(PluginError) as refused:
        create(plugin, iso_pod, msg.guaranteed(iso_pod, "app", cpus=3))
    assert "exclusive isolated CPUs" in str(refused.value)
    assert plugin.ledger.allocations == before


def test_a_bad_value_is_refused_in_one_line(plugin):
    iso_pod = msg.pod("iso", annotations={"numa.nri.io/isolated-cpus": "always"})
    with pytest.raises(PluginError, match="InvalidAnnotation.*numa.nri.io/isolated-cpus: "
                                          "'always' is not one of prefer, require"):
        create(plugin, iso_pod, msg.guaranteed(iso_pod, "app", cpus=1))


def test_metrics_count_isolated_cpus_per_node(plugin):
    metrics = PluginMetrics(lambda: (plugin.ledger, plugin.containers))
    iso_pod = msg.pod("iso", annotations={"numa.nri.io/isolated-cpus": "prefer"})
    create(plugin, iso_pod, msg.guaranteed(iso_pod, "app", cpus=1))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in metrics.registry.collect() for s in family.samples}

    def isolated(node: str, state: str) -> float:
        return got[("nri_numa_numa_node_isolated_cpus", (("numa_node", node), ("state", state)))]

    assert (isolated("0", "exclusive"), isolated("0", "free")) == (1, 1)
    assert (isolated("1", "exclusive"), isolated("1", "free")) == (0, 1)
    # Free for a container without the annotation: neither reserved nor isolated.
    assert got[("nri_numa_numa_node_free_cpus", (("numa_node", "0"),))] == 1
    assert got[("nri_numa_numa_node_free_cpus", (("numa_node", "1"),))] == 3


def test_a_checkpoint_whose_pool_holds_isolated_cpus_is_set_aside(plugin, state_dir, caplog):
    caplog.set_level(logging.INFO)  # the journal's line too, whatever logging earlier tests set
    # Written by a plugin that did not keep them out: same machine, pool 0-7.
    topology = replace(plugin.ledger.ctx.topology, isolcpus=frozenset())
    older = NumaPlugin(topology, config_from_mapping(CONFIG),
                       CheckpointStore(state_dir, machine_fingerprint(topology)))
    g_pod = msg.pod("g")
    create(older, g_pod, msg.guaranteed(g_pod, "app", cpus=1))
    restarted = NumaPlugin(plugin.ledger.ctx.topology, config_from_mapping(CONFIG),
                           CheckpointStore(state_dir, machine_fingerprint(topology)))
    # One warning, the snapshot's (its journal goes aside with it in an info line).
    [line] = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "set aside as" in r.getMessage()]
    assert "isolated CPUs 2-3,7 are in the shared pool" in line
    assert restarted.ledger.allocations.shared == parse_list(SHARED)
