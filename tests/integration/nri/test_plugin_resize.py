"""UpdateContainer with new resources: the in-place resize through the plugin, with real
protobuf messages as containerd sends them and the checkpoint on disk."""

from __future__ import annotations

import pytest

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.topology.cpulist import format_list, parse_list
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, create, new_plugin


def update(plugin, sandbox, container, cpus: int, memory: int = 1 << 30):
    """The runtime's UpdateContainer for a CRI UpdateContainerResources to ``cpus`` CPUs."""
    wanted = msg.guaranteed(sandbox, container.name, cpus=cpus, memory=memory,
                            cid=container.id)
    return plugin.update_container(api.UpdateContainerRequest(
        pod=sandbox, container=container, linux_resources=wanted.linux.resources))


def test_a_grow_adds_cpus_on_the_same_node_and_shrinks_the_shared_pool(state_dir):
    plugin = new_plugin(state_dir)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be, g = msg.container(be_pod, "app"), msg.guaranteed(g_pod, "app", cpus=2)
    create(plugin, be_pod, be)
    first = parse_list(create(plugin, g_pod, g).adjust.linux.resources.cpu.cpus)
    reply = update(plugin, g_pod, g, 3)
    mine, *others = reply.update
    now = parse_list(mine.linux.resources.cpu.cpus)
    assert mine.container_id == g.id and not mine.ignore_failure
    assert first < now and len(now) == 3 and len({c // 4 for c in now}) == 1
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in others] == [
        (be.id, format_list(set(range(8)) - now))]
    assert plugin.containers[g.id].cpus == now
    assert plugin.containers[g.id].request.cpu_request == 3000
    # The shrink gives the added CPU back, to the pool and the shared container.
    grown = msg.guaranteed(g_pod, "app", cpus=3, cid=g.id)
    reply = update(plugin, g_pod, grown, 2)
    mine, *others = reply.update
    assert parse_list(mine.linux.resources.cpu.cpus) == first
    assert [u.linux.resources.cpu.cpus for u in others] == [format_list(set(range(8)) - first)]


def test_a_refused_resize_fails_the_update_and_changes_nothing(state_dir):
    plugin = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=2)
    create(plugin, g_pod, g)
    before = plugin.ledger.to_dict(), plugin.containers
    checkpoint = sorted(p.read_bytes() for p in state_dir.iterdir() if p.is_file())
    with pytest.raises(PluginError, match=r"resize refused: UnexpectedAdmissionError: .*NUMA"):
        update(plugin, g_pod, g, 5)  # a node holds 4 CPUs, single-numa-node
    with pytest.raises(PluginError, match=r"InfeasibleResize: .*admitted with"):
        update(plugin, g_pod, g, 1)
    assert (plugin.ledger.to_dict(), plugin.containers) == before
    assert sorted(p.read_bytes() for p in state_dir.iterdir() if p.is_file()) == checkpoint


def test_the_resized_allocation_survives_a_restart(state_dir):
    plugin = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=2)
    first = parse_list(create(plugin, g_pod, g).adjust.linux.resources.cpu.cpus)
    now = parse_list(update(plugin, g_pod, g, 3).update[0].linux.resources.cpu.cpus)
    again = new_plugin(state_dir)
    assert again.containers[g.id].cpus == now
    assert again.ledger.allocations == plugin.ledger.allocations
    grown = msg.guaranteed(g_pod, "app", cpus=3, cid=g.id)
    # Synchronize with the container as it runs keeps the resized CPUs.
    running = msg.container(g_pod, "app", cpu=3000, cpu_limit=3000, memory=1 << 30, cid=g.id,
                            cpus=format_list(now), state=api.CONTAINER_RUNNING)
    reply = again.synchronize(api.SynchronizeRequest(pods=[g_pod], containers=[running]))
    assert g.id not in {u.container_id for u in reply.update}
    assert again.containers[g.id].cpus == now
    with pytest.raises(PluginError, match="admitted with"):
        update(again, g_pod, grown, 1)
    assert parse_list(update(again, g_pod, grown, 2).update[0].linux.resources.cpu.cpus) == first


def test_a_shared_container_keeps_the_pool_and_an_unchanged_update_keeps_its_cpuset(state_dir):
    plugin = new_plugin(state_dir)
    b_pod = msg.pod("b", "burstable")
    b = msg.container(b_pod, "app", cpu=500, cpu_limit=1000)
    create(plugin, b_pod, b)
    wanted = msg.container(b_pod, "app", cpu=1500, cpu_limit=2000, cid=b.id)
    reply = plugin.update_container(api.UpdateContainerRequest(
        pod=b_pod, container=b, linux_resources=wanted.linux.resources))
    [mine] = reply.update
    assert mine.linux.resources.cpu.cpus == ALL
    assert plugin.containers[b.id].request.cpu_request == 1500


@pytest.mark.parametrize("field,value", [
    ("shares", 0), ("shares", 1 << 62), ("quota", -5), ("quota", 1 << 62), ("period", 0),
    ("period", 1 << 62)])
def test_odd_new_resources_are_one_line_or_a_resize_never_a_traceback(state_dir, field, value):
    plugin = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=2)
    create(plugin, g_pod, g)
    ledger = plugin.ledger.to_dict()
    wanted = msg.guaranteed(g_pod, "app", cpus=2, cid=g.id)
    getattr(wanted.linux.resources.cpu, field).value = value
    try:
        reply = plugin.update_container(api.UpdateContainerRequest(
            pod=g_pod, container=g, linux_resources=wanted.linux.resources))
    except PluginError as e:
        assert "\n" not in str(e) and str(e).startswith("nri-numa: ")
        assert plugin.ledger.to_dict() == ledger
    else:
        assert reply.update[0].container_id == g.id
