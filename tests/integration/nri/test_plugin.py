"""The plugin's handlers driven with protobuf messages built as containerd builds them."""

from __future__ import annotations

import errno
import os

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.state import journal
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
from nri_numa.topology.cpulist import format_list, parse_list
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import (ALL, CONFIG, GPU_ON_NODE_1, Sent, cpusets, create,
                                              new_plugin)

# --- CreateContainer and the shared pool -----------------------------------------------------


def test_guaranteed_container_shrinks_the_shared_pool_in_the_same_reply(state_dir):
    plugin = new_plugin(state_dir)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be = msg.container(be_pod, "app")
    reply = create(plugin, be_pod, be)
    assert reply.adjust.linux.resources.cpu.cpus == ALL
    assert reply.adjust.linux.resources.cpu.mems == ""  # shared: memory left alone
    assert not reply.update

    g = msg.guaranteed(g_pod, "app", cpus=1)
    reply = create(plugin, g_pod, g)
    exclusive = reply.adjust.linux.resources.cpu.cpus
    assert exclusive not in ("", "0") and "," not in exclusive and "-" not in exclusive
    node = int(exclusive) // 4
    assert node in (0, 1)
    assert reply.adjust.linux.resources.cpu.mems == ""  # no Memory Manager: memory left alone
    [update] = reply.update
    assert update.container_id == be.id and update.ignore_failure
    assert update.linux.resources.cpu.cpus == format_list(set(range(8)) - {int(exclusive)})
    assert plugin.ledger.allocations.shared == frozenset(range(8)) - {int(exclusive)}


def test_stop_grows_the_shared_pool_back(state_dir):
    plugin = new_plugin(state_dir)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be, g = msg.container(be_pod, "app"), msg.guaranteed(g_pod, "app", cpus=2)
    create(plugin, be_pod, be)
    create(plugin, g_pod, g)
    reply = plugin.stop_container(api.StopContainerRequest(pod=g_pod, container=g))
    assert cpusets(reply.update) == {be.id: ALL}
    assert g.id not in plugin.containers
    assert plugin.ledger.allocations.shared == frozenset(range(8))
    # RemoveContainer after the stop has nothing left to do.
    sent = Sent()
    plugin._send_updates = sent
    plugin.state_change(msg.event(api.REMOVE_CONTAINER, g_pod, g))
    assert sent.batches == []


def test_pod_removal_without_stops_sends_updates_after_the_event(state_dir):
    sent = Sent()
    plugin = new_plugin(state_dir, sent)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    be = msg.container(be_pod, "app")
    create(plugin, be_pod, be)
    create(plugin, g_pod, msg.guaranteed(g_pod, "a", cpus=1))
    create(plugin, g_pod, msg.guaranteed(g_pod, "b", cpus=1))
    plugin.state_change(msg.event(api.RUN_POD_SANDBOX, g_pod))  # nothing to do
    assert sent.batches == []
    plugin.state_change(msg.event(api.STOP_POD_SANDBOX, g_pod))
    [batch] = sent.batches
    assert cpusets(batch) == {be.id: ALL}
    assert set(plugin.containers) == {be.id}
    assert set(plugin.ledger.allocations.pods) == {"uid-be"}
    plugin.state_change(msg.event(api.REMOVE_POD_SANDBOX, g_pod))
    assert len(sent.batches) == 1


def test_refusal_carries_the_engines_reason_and_changes_nothing(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("big")
    before = plugin.ledger.allocations
    with pytest.raises(PluginError) as refused:
        create(plugin, sandbox, msg.guaranteed(sandbox, "app", cpus=5))
    text = str(refused.value)
    assert "TopologyAffinityError" in text and "single-numa-node" in text
    assert "node 0: " in text and "node 1: " in text  # what each node had free
    assert plugin.ledger.allocations == before and not plugin.containers
    assert not (state_dir / "checkpoint.json").exists()


def test_bad_pod_annotation_is_refused_with_its_name(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("odd", annotations={"numa.nri.io/topology-policy": "best-effort"})
    with pytest.raises(PluginError, match="InvalidAnnotation.*numa.nri.io/topology-policy"):
        create(plugin, sandbox, msg.guaranteed(sandbox, "app", cpus=1))


def test_unreadable_container_is_refused_with_the_field(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("odd")
    c = msg.guaranteed(sandbox, "app", cpus=1, hugepages={"2QB": 1})
    with pytest.raises(PluginError, match="cannot read container .*hugepage size '2QB'"):
        create(plugin, sandbox, c)


def test_a_failed_checkpoint_write_refuses_and_rolls_back(state_dir, monkeypatch):
    plugin = new_plugin(state_dir)
    be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
    create(plugin, be_pod, msg.container(be_pod, "app"))
    before, records = plugin.ledger.allocations, plugin.containers

    def full(self, payload):
        raise CheckpointError("cannot write /state/checkpoint.json: No space left on device")

    def no_space(fd, body, sync):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(CheckpointStore, "save", full)  # a snapshot
    monkeypatch.setattr(journal, "append", no_space)  # a journal record
    with pytest.raises(PluginError, match="cannot save state, nothing changed.*No space"):
        create(plugin, g_pod, msg.guaranteed(g_pod, "app", cpus=1))
    assert plugin.ledger.allocations == before and plugin.containers == records


def test_a_restarted_container_replaces_the_old_one(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("g")
    old = msg.guaranteed(sandbox, "app", cpus=2, cid="old")
    create(plugin, sandbox, old)
    # The stop was missed; the kubelet creates the container again under a new id.
    new = msg.guaranteed(sandbox, "app", cpus=3, cid="new")
    reply = create(plugin, sandbox, new)
    assert len(parse_list(reply.adjust.linux.resources.cpu.cpus)) == 3
    assert set(plugin.containers) == {"new"}
    assert len(plugin.ledger.allocations.exclusive_cpus()) == 3


def test_devices_the_container_has_pull_its_cpus_to_their_node(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("gpu")
    by_env = msg.guaranteed(sandbox, "env", cpus=1, env=[f"NVIDIA_VISIBLE_DEVICES={GPU_ON_NODE_1}"])
    by_node = msg.guaranteed(sandbox, "node", cpus=1, devices=[("/dev/nvidia0", "c", 195, 0)])
    for c in (by_env, by_node):
        cpu = create(plugin, sandbox, c).adjust.linux.resources.cpu
        assert parse_list(cpu.cpus) <= {4, 5, 6, 7} and cpu.mems == ""  # no Memory Manager


@pytest.mark.parametrize("scope, second_node", [("container", "0"), ("pod", "1")])
def test_pod_scope_keeps_the_first_containers_nodes(state_dir, scope, second_node):
    # The first container follows its GPU to node 1; alone, a 1-CPU container goes to node 0.
    plugin = new_plugin(state_dir, topologyManagerScope=scope)
    sandbox = msg.pod("team")
    first = create(plugin, sandbox, msg.guaranteed(
        sandbox, "trainer", cpus=2, env=[f"NVIDIA_VISIBLE_DEVICES={GPU_ON_NODE_1}"]))
    assert {c // 4 for c in parse_list(first.adjust.linux.resources.cpu.cpus)} == {1}
    second = create(plugin, sandbox, msg.guaranteed(sandbox, "helper", cpus=1))
    assert {c // 4 for c in parse_list(second.adjust.linux.resources.cpu.cpus)} == {int(second_node)}


def test_update_container_keeps_our_cpuset(state_dir):
    plugin = new_plugin(state_dir)
    sandbox = msg.pod("g")
    g = msg.guaranteed(sandbox, "app", cpus=2)
    placed = create(plugin, sandbox, g).adjust.linux.resources.cpu
    reply = plugin.update_container(api.UpdateContainerRequest(pod=sandbox, container=g))
    [update] = reply.update
    assert update.container_id == g.id and not update.ignore_failure
    assert (update.linux.resources.cpu.cpus, update.linux.resources.cpu.mems) == (
        placed.cpus, placed.mems)
    stranger = msg.container(sandbox, "stranger")
    assert not plugin.update_container(
        api.UpdateContainerRequest(pod=sandbox, container=stranger)).update
    assert not plugin.stop_container(api.StopContainerRequest(pod=sandbox, container=stranger)).update


# --- Configure ------------------------------------------------------------------------------


def test_configure_subscribes_to_the_handled_events():
    plugin = new_plugin()
    reply = plugin.configure(api.ConfigureRequest(runtime_name="containerd",
                                                  runtime_version="1.7.24"))
    assert reply.events == 0x6CF


@pytest.mark.parametrize("text, message", [
    ("topologyManagerPolicy: strict\n", "topologyManagerPolicy: 'strict' is not one of"),
    ("topologyManagerPolcy: restricted\n", "unknown key 'topologyManagerPolcy'"),
    ("cpuManagerPolicy: [static\n", "not YAML"),
    ("- a\n- b\n", "must be a map"),
    ("reservedSystemCPUs: '64'\ncpuManagerPolicy: static\n", "does not fit this machine"),
])
def test_bad_plugin_config_names_the_key(text, message):
    plugin = new_plugin()
    with pytest.raises(PluginError, match=message):
        plugin.configure(api.ConfigureRequest(config=text))
    assert plugin.ledger.ctx.config == config_from_mapping(CONFIG)


def test_runtime_config_replaces_the_file_config_and_keeps_placements():
    plugin = new_plugin()
    sandbox = msg.pod("g")
    create(plugin, sandbox, msg.guaranteed(sandbox, "app", cpus=1))
    held = plugin.ledger.allocations
    plugin.configure(api.ConfigureRequest(
        config="cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n"
               "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n"))
    assert str(plugin.ledger.ctx.config.topology_manager_scope) == "pod"
    assert plugin.ledger.allocations == held


@pytest.mark.parametrize("config, change", [
    ("cpuManagerPolicy: static\nreservedSystemCPUs: '0'\ntopologyManagerPolicy: restricted\n",
     "topologyManagerPolicy 'single-numa-node' → 'restricted'"),
    ("cpuManagerPolicy: static\nreservedSystemCPUs: '4'\ntopologyManagerPolicy: single-numa-node\n",
     "reservedCPUs '0' → '4'"),
    ("topologyManagerPolicy: single-numa-node\n", "cpuManagerPolicy 'static' → 'none'"),
])
def test_runtime_config_changing_a_policy_under_live_placements_is_refused(config, change):
    plugin = new_plugin()
    sandbox = msg.pod("g")
    create(plugin, sandbox, msg.guaranteed(sandbox, "app", cpus=4))  # only node 1 fits: 4-7
    before, config_before = plugin.ledger.allocations, plugin.ledger.ctx.config
    with pytest.raises(PluginError) as refused:
        plugin.configure(api.ConfigureRequest(config=config))
    assert change in str(refused.value) and "1 container" in str(refused.value)
    assert "drain this node" in str(refused.value)
    assert plugin.ledger.allocations == before and plugin.ledger.ctx.config == config_before
    assert len(plugin.containers) == 1


def test_runtime_config_changing_a_policy_with_nothing_placed_is_taken():
    plugin = new_plugin()
    plugin.configure(api.ConfigureRequest(config="cpuManagerPolicy: static\n"
                                                 "reservedSystemCPUs: '4'\n"))
    assert plugin.ledger.ctx.reserved_cpus == {4}
    assert str(plugin.ledger.ctx.config.topology_manager_policy) == "none"
