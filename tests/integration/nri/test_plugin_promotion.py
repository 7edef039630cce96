"""Degraded containers (nri_numa.nri.promotion): a Guaranteed container adopted at Synchronize
while no room was left runs in the shared pool until room appears, and is then moved onto its
own CPUs (and memory nodes) at the release, resize, Synchronize or drift check that made room;
one decision line ``promoted``, a gauge, one warning per container.

The machine (plugin_env): CPUs 0-3 on node 0 (0 reserved) and 4-7 on node 1, single-numa-node.
``full`` fills both nodes (4 CPUs on node 1, then 3 on node 0) and adopts a 1-CPU Guaranteed
container that was started while the plugin was away: it does not fit."""

from __future__ import annotations

import logging

import pytest

from nri_numa.agent.metrics import PluginMetrics
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri import promotion
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import format_list
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import ALL, CONFIG, Sent, cpusets, create, machine

RUNNING = api.CONTAINER_RUNNING
STATIC_MEMORY = {"memoryManagerPolicy": "Static",
                 "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                                    {"numaNode": 1, "limits": {"memory": "1Gi"}}]}


class Told:
    """What the plugin hands ``on_degraded`` (the pod's Event)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, pod, container: str, text: str) -> None:
        self.calls.append((pod.name, container, text))


def plugin_on(state_dir, sent: Sent | None = None, told: Told | None = None,
              metrics: bool = False, **config) -> tuple[NumaPlugin, PluginMetrics | None]:
    topology = machine()
    holder: list[NumaPlugin] = []
    gauge = (PluginMetrics(lambda: (holder[0].ledger, holder[0].containers),
                           degraded=lambda: holder[0].degraded_count) if metrics else None)
    plugin = NumaPlugin(topology, config_from_mapping({**CONFIG, **config}),
                        CheckpointStore(state_dir, machine_fingerprint(topology)),
                        send_updates=sent, on_degraded=told,
                        **({"metrics": gauge} if gauge else {}))
    holder.append(plugin)
    return plugin, gauge


def running(c: api.Container, cpus: str, pid: int) -> api.Container:
    c.state, c.pid = RUNNING, pid
    c.linux.resources.cpu.cpus = cpus
    return c


def sync(plugin: NumaPlugin, pods, containers) -> api.SynchronizeResponse:
    return plugin.synchronize(api.SynchronizeRequest(pods=pods, containers=containers))


class Full:
    """Both nodes' exclusive CPUs held (``four`` on node 1, ``three`` on node 0), and ``late``,
    a 1-CPU Guaranteed container started while the plugin was away, adopted degraded."""

    def __init__(self, plugin: NumaPlugin, late_cpus: int = 1,
                 late_annotations: dict[str, str] | None = None) -> None:
        self.pods = {name: msg.pod(name, annotations=late_annotations if name == "late" else None)
                     for name in ("four", "three", "late")}
        self.four = msg.guaranteed(self.pods["four"], "app", cpus=4)
        self.three = msg.guaranteed(self.pods["three"], "app", cpus=3)
        self.late = msg.guaranteed(self.pods["late"], "app", cpus=late_cpus)
        create(plugin, self.pods["four"], self.four)
        create(plugin, self.pods["three"], self.three)
        assert plugin.containers[self.four.id].cpus == {4, 5, 6, 7}
        assert plugin.containers[self.three.id].cpus == {1, 2, 3}
        self.reply = sync(plugin, list(self.pods.values()), self.live(plugin))
        record = plugin.containers[self.late.id]
        assert not record.in_ledger and not record.exclusive

    def live(self, plugin: NumaPlugin, *gone: api.Container) -> list[api.Container]:
        """The containers as the runtime lists them now, but ``gone``."""
        out = []
        for pid, c in enumerate((self.four, self.three, self.late), start=10):
            if c in gone:
                continue
            record = plugin.containers.get(c.id)
            cpus = (ALL if record is None else format_list(plugin.containers[c.id].cpus)
                    if record.exclusive else format_list(plugin.ledger.allocations.shared))
            out.append(running(c, cpus, pid))
        return out

    def stop(self, plugin: NumaPlugin, c: api.Container) -> api.StopContainerResponse:
        sandbox = next(p for p in self.pods.values() if p.id == c.pod_sandbox_id)
        return plugin.stop_container(api.StopContainerRequest(pod=sandbox, container=c))


def promoted_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("promoted ")]


def test_a_stop_that_frees_cpus_promotes_the_degraded_container_in_its_reply(state_dir, caplog):
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin)
    assert plugin.degraded_count == 1
    with caplog.at_level(logging.INFO):
        reply = full.stop(plugin, full.three)
    record = plugin.containers[full.late.id]
    assert record.in_ledger and record.exclusive and len(record.cpus) == 1
    assert record.cpus <= {1, 2, 3}
    shared = frozenset({0, 1, 2, 3}) - record.cpus
    assert plugin.ledger.allocations.shared == shared
    # Its own cpuset in the StopContainer reply; no shared container is left to shrink.
    assert cpusets(reply.update) == {full.late.id: format_list(record.cpus)}
    assert promoted_lines(caplog) == [
        f"promoted pod default/late container app: policy single-numa-node, hint NUMA 0 "
        f"(preferred), cpus {format_list(record.cpus)} (exclusive), mems unchanged"]
    assert plugin.degraded_count == 0
    # Written before the reply: a restart reads it back placed.
    again, _ = plugin_on(state_dir)
    assert again.containers[full.late.id] == record and again.degraded_count == 0


def test_a_removed_container_promotes_through_the_unsolicited_update(state_dir, caplog):
    sent = Sent()
    plugin, _ = plugin_on(state_dir, sent)
    full = Full(plugin)
    with caplog.at_level(logging.INFO):
        plugin.state_change(msg.event(api.REMOVE_CONTAINER, full.pods["four"], full.four))
    record = plugin.containers[full.late.id]
    assert record.exclusive and record.cpus <= {4, 5, 6, 7}
    assert [cpusets(batch) for batch in sent.batches] == [
        {full.late.id: format_list(record.cpus)}]
    assert len(promoted_lines(caplog)) == 1


def test_a_removed_pod_promotes_too(state_dir):
    sent = Sent()
    plugin, _ = plugin_on(state_dir, sent)
    full = Full(plugin)
    plugin.state_change(msg.event(api.REMOVE_POD_SANDBOX, full.pods["three"]))
    assert plugin.containers[full.late.id].cpus <= {1, 2, 3}
    assert [list(cpusets(batch)) for batch in sent.batches] == [[full.late.id]]


def test_a_release_that_frees_too_little_leaves_it_degraded_without_a_line(state_dir, caplog):
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin, late_cpus=4)  # needs a whole node
    with caplog.at_level(logging.INFO):
        reply = full.stop(plugin, full.three)  # node 0 has only 3
    assert not plugin.containers[full.late.id].in_ledger and plugin.degraded_count == 1
    assert not promoted_lines(caplog)
    # The degraded one follows the pool as it grows, as before.
    assert cpusets(reply.update) == {full.late.id: "0-3"}
    with caplog.at_level(logging.INFO):
        full.stop(plugin, full.four)
    assert plugin.containers[full.late.id].cpus == {4, 5, 6, 7}
    assert len(promoted_lines(caplog)) == 1


def resize(plugin: NumaPlugin, sandbox: api.PodSandbox, c: api.Container,
           cpus: int) -> api.UpdateContainerResponse:
    resized = msg.guaranteed(sandbox, c.name, cpus=cpus)
    return plugin.update_container(api.UpdateContainerRequest(
        pod=sandbox, container=c, linux_resources=resized.linux.resources))


def test_a_resize_down_promotes_in_the_update_reply(state_dir):
    # A container that grew from 3 to 4 CPUs on node 1 fills it; shrinking back to 3 gives the
    # grown CPU back (a container never gives back what it was admitted with).
    plugin, _ = plugin_on(state_dir)
    pods = {name: msg.pod(name) for name in ("grows", "three", "late")}
    grows = msg.guaranteed(pods["grows"], "app", cpus=3)
    three = msg.guaranteed(pods["three"], "app", cpus=3)
    late = msg.guaranteed(pods["late"], "app", cpus=1)
    create(plugin, pods["three"], three)
    create(plugin, pods["grows"], grows)
    assert plugin.containers[three.id].cpus == {1, 2, 3}
    resize(plugin, pods["grows"], grows, 4)
    assert plugin.containers[grows.id].cpus == {4, 5, 6, 7}
    sync(plugin, list(pods.values()), [running(three, "1-3", 1), running(grows, "4-7", 2),
                                       running(late, ALL, 3)])
    assert plugin.degraded_count == 1
    reply = resize(plugin, pods["grows"], grows, 3)
    shrunk, promoted = plugin.containers[grows.id], plugin.containers[late.id]
    assert len(shrunk.cpus) == 3 and promoted.exclusive
    assert promoted.cpus == {4, 5, 6, 7} - shrunk.cpus
    got = cpusets(reply.update)
    assert got == {grows.id: format_list(shrunk.cpus), late.id: format_list(promoted.cpus)}
    assert len(reply.update) == 2  # one update per container


def test_room_that_appeared_while_the_plugin_was_away_is_found_at_synchronize(state_dir,
                                                                               caplog):
    first, _ = plugin_on(state_dir)
    full = Full(first)
    # The plugin stops; container three is removed meanwhile; a new process starts.
    second, _ = plugin_on(state_dir)
    assert second.degraded_count == 1  # read back from the checkpoint: never stored as such
    with caplog.at_level(logging.INFO):
        reply = sync(second, list(full.pods.values()), full.live(first, full.three))
    record = second.containers[full.late.id]
    assert record.exclusive and record.cpus <= {1, 2, 3}
    assert cpusets(reply.update)[full.late.id] == format_list(record.cpus)
    assert len(promoted_lines(caplog)) == 1
    assert "drift" not in caplog.text  # it was only now given its CPUs
    assert second.degraded_count == 0


def test_the_drift_check_promotes_where_room_is(state_dir, caplog):
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin)
    # Room made without the plugin's release path (as a release whose promotion failed).
    plugin._records.release([full.three.id])
    with caplog.at_level(logging.INFO):
        updates = plugin.reconcile()
    record = plugin.containers[full.late.id]
    assert record.exclusive and cpusets(updates)[full.late.id] == format_list(record.cpus)
    assert len(promoted_lines(caplog)) == 1 and "repaired" not in caplog.text


def test_under_the_memory_manager_it_gets_its_memory_nodes_too(state_dir):
    plugin, _ = plugin_on(state_dir, **STATIC_MEMORY)
    full = Full(plugin)
    reply = full.stop(plugin, full.three)
    record = plugin.containers[full.late.id]
    assert record.mems == {0} and record.cpus <= {1, 2, 3}
    update = next(u for u in reply.update if u.container_id == full.late.id)
    assert update.linux.resources.cpu.mems == "0"
    assert plugin.ledger.allocations.memory.container_blocks("uid-late", "app")


def test_one_warning_and_one_event_per_degraded_container(state_dir, caplog):
    told = Told()
    plugin, _ = plugin_on(state_dir, told=told)
    with caplog.at_level(logging.WARNING):
        full = Full(plugin)
        sync(plugin, list(full.pods.values()), full.live(plugin))  # a reconnection
    assert [call[:2] for call in told.calls] == [("late", "app")]
    assert "without the exclusive CPUs" in told.calls[0][2]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("degraded ")]
    assert lines == [f"degraded pod default/late container app: {told.calls[0][2]}"]
    full.stop(plugin, full.three)
    sync(plugin, list(full.pods.values()), full.live(plugin, full.three))
    assert len(told.calls) == 1  # promoted: nothing more to say


def test_the_gauge_counts_degraded_containers(state_dir):
    plugin, metrics = plugin_on(state_dir, metrics=True)

    def gauge() -> float:
        return next(s.value for f in metrics.registry.collect() for s in f.samples
                    if s.name == "nri_numa_degraded_containers")

    assert gauge() == 0
    full = Full(plugin)
    assert gauge() == 1
    full.stop(plugin, full.three)
    assert gauge() == 0


def test_a_besteffort_container_that_was_adopted_is_not_degraded(state_dir):
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin)
    be_pod = msg.pod("be", "besteffort")
    be = running(msg.container(be_pod, "app"), ALL, pid=30)
    sync(plugin, [*full.pods.values(), be_pod], [*full.live(plugin), be])
    assert plugin.containers[be.id].in_ledger  # admitted into the pool: never degraded
    assert [r.id for r in promotion.degraded(plugin._records)] == [full.late.id]


def test_nothing_degraded_costs_no_admission(state_dir, monkeypatch):
    plugin, _ = plugin_on(state_dir)
    pods = {n: msg.pod(n) for n in ("a", "b")}
    a, b = (msg.guaranteed(pods[n], "app", cpus=1) for n in pods)
    create(plugin, pods["a"], a)
    create(plugin, pods["b"], b)

    def no_admission(*args, **kwargs):
        raise AssertionError("an admission while nothing is degraded")

    monkeypatch.setattr(promotion, "degraded", no_admission)
    monkeypatch.setattr("nri_numa.state.ledger.admit", no_admission)
    plugin.stop_container(api.StopContainerRequest(pod=pods["a"], container=a))
    plugin.state_change(msg.event(api.REMOVE_POD_SANDBOX, pods["b"]))
    assert plugin.reconcile() == [] and not plugin.containers


def test_a_placement_that_needs_devices_it_does_not_have_is_not_taken(state_dir, caplog):
    # Its pod asks nri-numa for the GPU (on node 1), which it was never given: when node 1's
    # CPUs free up, admitting it would hand a running container a GPU it cannot receive.
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin, late_annotations={"numa.nri.io/devices.app": "nvidia.com/gpu=1"})
    with caplog.at_level(logging.INFO):
        full.stop(plugin, full.four)
    assert not plugin.containers[full.late.id].in_ledger and plugin.degraded_count == 1
    assert not promoted_lines(caplog)
    assert plugin.ledger.allocations.container("uid-late", "app") is None
    assert plugin.ledger.allocations.devices_in_use("nvidia.com/gpu") == frozenset()


@pytest.mark.parametrize("event", [api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX])
def test_the_degraded_container_itself_going_frees_nothing_and_counts_no_more(state_dir, event):
    plugin, _ = plugin_on(state_dir)
    full = Full(plugin)
    plugin.state_change(msg.event(event, full.pods["late"]))
    assert full.late.id not in plugin.containers and plugin.degraded_count == 0
