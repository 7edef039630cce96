"""Synchronize (adopt, release, restore cpusets), restart from the checkpoint, and the plugin
through a real socket with a runtime side written apart from nri_numa's wire code."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time

import pytest

from nri_numa.nri.daemon import UpdateSender
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import NriSession
from nri_numa.state.encoding import canonical
from nri_numa.state.recorded_config import ConfigChangedError
from nri_numa.topology.cpulist import format_list, parse_list
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import CallFailed, FakeRuntime
from tests.integration.nri.plugin_env import ALL, cpusets, create, new_plugin

RUNNING = api.CONTAINER_RUNNING


def sync(plugin, pods, containers) -> api.SynchronizeResponse:
    return plugin.synchronize(api.SynchronizeRequest(pods=pods, containers=containers))


def running(c: api.Container, cpus: str, pid: int) -> api.Container:
    c.state, c.pid = RUNNING, pid
    c.linux.resources.cpu.cpus = cpus
    return c


def test_synchronize_adopts_what_runs(state_dir):
    plugin = new_plugin(state_dir)
    pinned_pod, loose_pod, be_pod = msg.pod("pinned"), msg.pod("loose"), msg.pod("be", "besteffort")
    # Already on exclusive-looking free CPUs: stays there.
    pinned = running(msg.guaranteed(pinned_pod, "app", cpus=2), "6-7", pid=100)
    # Guaranteed but on every CPU (started before nri-numa): gets exclusive CPUs.
    loose = running(msg.guaranteed(loose_pod, "app", cpus=1), ALL, pid=200)
    be = running(msg.container(be_pod, "app"), ALL, pid=300)
    done = msg.container(be_pod, "done", state=api.CONTAINER_STOPPED)
    reply = sync(plugin, [pinned_pod, loose_pod, be_pod], [be, done, loose, pinned])
    records = plugin.containers
    assert records[pinned.id].cpus == {6, 7} and records[pinned.id].exclusive
    moved = records[loose.id].cpus
    assert len(moved) == 1 and not moved & {0, 6, 7}
    shared = frozenset(range(8)) - {6, 7} - moved
    assert plugin.ledger.allocations.shared == shared
    assert cpusets(reply.update) == {loose.id: format_list(moved), be.id: format_list(shared)}
    assert done.id not in records
    assert all(u.ignore_failure for u in reply.update)


def test_synchronize_keeps_cpus_that_are_taken_or_reserved_out_of_adoption(state_dir):
    plugin = new_plugin(state_dir)
    a_pod, b_pod = msg.pod("a"), msg.pod("b")
    a = running(msg.guaranteed(a_pod, "app", cpus=1), "5", pid=10)
    b = running(msg.guaranteed(b_pod, "app", cpus=1), "5", pid=20)  # same CPU: b must move
    r_pod = msg.pod("r")
    r = running(msg.guaranteed(r_pod, "app", cpus=1), "0", pid=30)  # reserved CPU: must move
    reply = sync(plugin, [a_pod, b_pod, r_pod], [b, r, a])
    records = plugin.containers
    assert records[a.id].cpus == {5}
    assert records[b.id].cpus != {5} and records[r.id].cpus != {0}
    assert set(cpusets(reply.update)) == {b.id, r.id}


def test_a_running_container_that_does_not_fit_follows_the_shared_pool(state_dir, caplog):
    plugin = new_plugin(state_dir)
    big_pod, small_pod = msg.pod("big"), msg.pod("small")
    small = running(msg.guaranteed(small_pod, "app", cpus=3), "4-6", pid=1)
    big = running(msg.guaranteed(big_pod, "app", cpus=5), ALL, pid=2)  # no node has 5
    with caplog.at_level(logging.WARNING):
        reply = sync(plugin, [big_pod, small_pod], [big, small])
    assert "does not fit" in caplog.text and "TopologyAffinityError" in caplog.text
    record = plugin.containers[big.id]
    assert not record.exclusive and not record.in_ledger
    assert cpusets(reply.update) == {big.id: "0-3,7"}


def test_synchronize_releases_what_is_gone_and_restores_drift(state_dir, caplog):
    plugin = new_plugin(state_dir)
    be_pod, g_pod, h_pod = msg.pod("be", "besteffort"), msg.pod("g"), msg.pod("h")
    be, g, h = (msg.container(be_pod, "app"), msg.guaranteed(g_pod, "app", cpus=2),
                msg.guaranteed(h_pod, "app", cpus=1))
    for sandbox, c in ((be_pod, be), (g_pod, g), (h_pod, h)):
        create(plugin, sandbox, c)
    g_cpus = plugin.containers[g.id].cpus
    h_cpus = plugin.containers[h.id].cpus
    # g went away while we were disconnected; h's cpuset was changed behind our back.
    be_now = running(be, format_list(frozenset(range(8)) - g_cpus - h_cpus), pid=5)
    h_now = running(h, ALL, pid=6)
    with caplog.at_level(logging.WARNING):
        reply = sync(plugin, [be_pod, h_pod], [be_now, h_now])
    assert "drift" in caplog.text and h.id in caplog.text
    assert set(plugin.containers) == {be.id, h.id}
    assert set(plugin.ledger.allocations.pods) == {"uid-be", "uid-h"}
    shared = frozenset(range(8)) - h_cpus
    assert cpusets(reply.update) == {be.id: format_list(shared), h.id: format_list(h_cpus)}


def test_an_unreadable_live_container_is_not_released(state_dir):
    plugin = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=2)
    create(plugin, g_pod, g)
    broken = running(msg.guaranteed(g_pod, "app", cpus=2), "not-a-list", pid=3)
    reply = sync(plugin, [g_pod], [broken])
    assert g.id in plugin.containers and not reply.update


def test_restart_from_the_checkpoint_gives_the_same_placements(state_dir):
    first = new_plugin(state_dir)
    pods = [msg.pod("be", "besteffort"), msg.pod("g"), msg.pod("bu", "burstable")]
    containers = [msg.container(pods[0], "app"), msg.guaranteed(pods[1], "app", cpus=2),
                  msg.guaranteed(pods[1], "side", cpus=1),
                  msg.container(pods[2], "app", cpu=500, cpu_limit=1000, memory=1 << 30)]
    for c in containers:
        create(first, next(p for p in pods if p.id == c.pod_sandbox_id), c)
    second = new_plugin(state_dir)
    assert second.containers == first.containers
    assert second.ledger.allocations == first.ledger.allocations
    # The runtime reports every container where we put it: nothing to change.
    def cpus(record):  # a shared container's record holds no CPUs: it runs on the pool
        return record.cpus if record.exclusive else first.ledger.allocations.shared

    now = [running(c, format_list(cpus(first.containers[c.id])), pid=i + 1)
           for i, c in enumerate(containers)]
    assert not sync(second, pods, now).update
    assert second.containers == first.containers


def test_a_corrupt_checkpoint_is_rebuilt_from_synchronize(state_dir):
    first = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=2)
    create(first, g_pod, g)
    cpus = first.containers[g.id].cpus
    (state_dir / "checkpoint.json").write_text('{"format": "nri-numa-checkpoint", "vers')
    second = new_plugin(state_dir)
    assert not second.containers and list(state_dir.glob("checkpoint.json.corrupt-*"))
    assert not sync(second, [g_pod], [running(g, format_list(cpus), pid=9)]).update
    assert second.containers[g.id].cpus == cpus  # adopted where it runs


def test_a_checkpoint_with_placements_from_other_policies_is_refused(state_dir):
    first = new_plugin(state_dir)
    g_pod = msg.pod("g")
    create(first, g_pod, msg.guaranteed(g_pod, "app", cpus=4))  # node 1: 4-7
    with pytest.raises(ConfigChangedError) as refused:
        new_plugin(state_dir, reservedSystemCPUs="4", topologyManagerPolicy="restricted")
    text = str(refused.value)
    assert "topologyManagerPolicy 'single-numa-node' → 'restricted'" in text
    assert "reservedCPUs '0' → '4'" in text and "1 container" in text
    assert f"delete {state_dir / 'checkpoint.json'}" in text
    assert not list(state_dir.glob("checkpoint.json.corrupt-*"))  # kept for the old settings
    assert new_plugin(state_dir).containers  # and the old settings still start


def test_a_checkpoint_from_other_policies_without_placements_is_set_aside(state_dir):
    first = new_plugin(state_dir)
    g_pod = msg.pod("g")
    g = msg.guaranteed(g_pod, "app", cpus=4)
    create(first, g_pod, g)
    first.stop_container(api.StopContainerRequest(pod=g_pod, container=g))
    second = new_plugin(state_dir, reservedSystemCPUs="4")
    assert not second.containers
    assert list(state_dir.glob("checkpoint.json.corrupt-*"))


def _forget_recorded_config(state_dir) -> None:
    """Make the checkpoint one that nri-numa wrote before it recorded its configuration."""
    path = state_dir / "checkpoint.json"
    envelope = json.loads(path.read_text())
    envelope["payload"].pop("config", None)
    envelope["sha256"] = hashlib.sha256(canonical(envelope["payload"])).hexdigest()
    path.write_text(json.dumps(envelope))


def test_a_checkpoint_that_does_not_record_its_configuration_is_still_read(state_dir):
    first = new_plugin(state_dir)
    g_pod = msg.pod("g")
    create(first, g_pod, msg.guaranteed(g_pod, "app", cpus=4))  # node 1: 4-7
    _forget_recorded_config(state_dir)
    assert len(new_plugin(state_dir).containers) == 1  # its ledger fits: kept
    _forget_recorded_config(state_dir)
    assert not new_plugin(state_dir, reservedSystemCPUs="4").containers  # does not fit
    assert list(state_dir.glob("checkpoint.json.corrupt-*"))


# --- through a socket ------------------------------------------------------------------------


def test_the_plugin_through_a_socketpair(state_dir):
    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end).start()
    session = NriSession(plugin_end)
    sender = UpdateSender()  # the daemon's: sends after the handler has returned
    sender.use(session)
    plugin = new_plugin(state_dir, sent=sender.submit)
    served = threading.Thread(target=session.run, args=(plugin, "nri-numa", "90"), daemon=True)
    served.start()
    try:
        assert runtime.registered.wait(5)
        assert (runtime.registration.plugin_name, runtime.registration.plugin_idx) == (
            "nri-numa", "90")
        assert runtime.configure().events == 0x6CF
        be_pod, g_pod = msg.pod("be", "besteffort"), msg.pod("g")
        be = running(msg.container(be_pod, "app"), ALL, pid=1)
        assert not runtime.synchronize(
            api.SynchronizeRequest(pods=[be_pod], containers=[be])).update

        reply = runtime.call("CreateContainer", msg.create(g_pod, msg.guaranteed(g_pod, "app", 1)),
                             api.CreateContainerResponse)
        exclusive = parse_list(reply.adjust.linux.resources.cpu.cpus)
        assert len(exclusive) == 1
        assert cpusets(reply.update) == {be.id: format_list(frozenset(range(8)) - exclusive)}

        with pytest.raises(CallFailed) as refused:
            runtime.call("CreateContainer", msg.create(g_pod, msg.guaranteed(g_pod, "big", 6)),
                         api.CreateContainerResponse)
        assert refused.value.code == 2 and "TopologyAffinityError" in refused.value.message

        # Pod removal has no room for updates in its reply: they come as UpdateContainers.
        runtime.call("StateChange", msg.event(api.REMOVE_POD_SANDBOX, g_pod), api.Empty)
        for _ in range(400):
            sent = [r for r in runtime.received.requests if r.method == "UpdateContainers"]
            if sent:
                break
            time.sleep(0.05)
        [request] = sent
        update = api.UpdateContainersRequest.FromString(request.payload)
        assert cpusets(update.update) == {be.id: ALL}
    finally:
        sender.stop()
        session.close()
        runtime.close()
        served.join(5)
