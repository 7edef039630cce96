"""NRI messages ⇄ runtime layer and placements: fields read, fields written, and their wire
numbers (docs/nri-protocol.md §8)."""

from __future__ import annotations

import pytest

from nri_numa.engine.decision import Placement
from nri_numa.engine.hints import Hint
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.runtime import DeviceNode, RuntimeInputError
from tests import nri_messages as msg

GIB = 1 << 30


def test_pod_sandbox():
    sandbox = msg.pod("web", "burstable", namespace="shop", uid="u-1",
                      annotations={"numa.nri.io/topology-scope": "pod"})
    pod = translate.runtime_pod(sandbox)
    assert (pod.id, pod.uid, pod.name, pod.namespace) == ("sb-web", "u-1", "web", "shop")
    assert pod.cgroup_parent == "/kubepods/burstable/podu-1"
    assert dict(pod.annotations) == {"numa.nri.io/topology-scope": "pod"}
    assert pod.labels["io.kubernetes.pod.uid"] == "u-1"


def test_container_resources_as_the_kubelet_writes_them():
    sandbox = msg.pod("web")
    c = msg.container(sandbox, "app", cpu=1500, cpu_limit=2000, memory=3 * GIB,
                      hugepages={"2MB": 4 << 20, "1GB": GIB},
                      devices=[("/dev/nvidia0", "c", 195, 0)],
                      env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-1"], cpus="0-3", mems="0")
    rc = translate.runtime_container(c, translate.runtime_pod(sandbox))
    assert (rc.id, rc.name, rc.pod.id) == ("ctr-web-app", "app", "sb-web")
    assert (rc.cpu_shares, rc.cpu_quota, rc.cpu_period) == (1536, 200_000, 100_000)
    assert rc.memory_limit == 3 * GIB
    assert dict(rc.hugepage_limits) == {2048: 4 << 20, 1048576: GIB}
    assert rc.devices == (DeviceNode("/dev/nvidia0", "c", 195, 0),)
    assert rc.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert rc.labels["io.kubernetes.container.name"] == "app"
    assert (rc.cpuset_cpus, rc.cpuset_mems) == ({0, 1, 2, 3}, {0})


def test_unset_fields_stay_unset():
    sandbox = api.PodSandbox(id="sb")
    rc = translate.runtime_container(api.Container(id="c", pod_sandbox_id="sb", name="n"),
                                     translate.runtime_pod(sandbox))
    assert (rc.cpu_shares, rc.cpu_quota, rc.cpu_period, rc.memory_limit) == (None,) * 4
    assert (rc.cpuset_cpus, rc.cpuset_mems) == (None, None)
    assert rc.pod.cgroup_parent == "" and not rc.hugepage_limits and not rc.devices


@pytest.mark.parametrize("change, message", [
    (lambda c: c.linux.resources.hugepage_limits.add(page_size="2XB", limit=1),
     "container app: hugepage size '2XB'"),
    (lambda c: setattr(c.linux.resources.cpu, "cpus", "3-1"), "container app: cpus: bad range"),
    (lambda c: setattr(c.linux.resources.cpu, "mems", "x"), "container app: mems"),
    (lambda c: c.linux.devices.add(path="/dev/x", type="q"), "container app: device /dev/x"),
    (lambda c: setattr(c, "name", ""), "container name must be a non-empty string"),
])
def test_bad_fields_are_named(change, message):
    sandbox = msg.pod("web")
    c = msg.container(sandbox, "app")
    change(c)
    with pytest.raises(RuntimeInputError, match=message):
        translate.runtime_container(c, translate.runtime_pod(sandbox))


def test_adjustment_on_the_wire():
    placement = Placement("app", frozenset({0, 1, 2, 3}), True, frozenset({0}), hint=Hint({0}, True))
    adjust = translate.adjustment(placement)
    assert (adjust.linux.resources.cpu.cpus, adjust.linux.resources.cpu.mems) == ("0-3", "0")
    # adjust(1) → linux(6) → resources(2) → cpu(2) → cpus(6) / mems(7)
    assert adjust.SerializeToString() == bytes.fromhex("320c120a1208" "3203") + b"0-3" + \
        bytes.fromhex("3a01") + b"0"


def test_adjustment_leaves_mems_alone_when_the_engine_does():
    shared = Placement("app", frozenset({0, 2, 3}), False, None)
    adjust = translate.adjustment(shared)
    assert adjust.linux.resources.cpu.cpus == "0,2-3"
    assert adjust.linux.resources.cpu.mems == ""  # "" = leave alone
    assert not adjust.linux.resources.cpu.HasField("shares")
    assert not adjust.linux.devices and not adjust.env


def test_cpuset_update():
    update = translate.cpuset_update("c9", frozenset({4, 5, 6}), frozenset({1}))
    assert update.container_id == "c9" and update.ignore_failure
    assert update.linux.resources.cpu.cpus == "4-6" and update.linux.resources.cpu.mems == "1"
    strict = translate.cpuset_update("c9", frozenset({1}), ignore_failure=False)
    assert not strict.ignore_failure and strict.linux.resources.cpu.mems == ""
    # ContainerUpdate: container_id(1), linux(2) → resources(1) → cpu(2) → cpus(6)
    assert strict.SerializeToString() == bytes.fromhex("0a02") + b"c9" + \
        bytes.fromhex("1207 0a05 1203 3201") + b"1"


def test_event_mask():
    assert translate.EVENT_MASK == 0x6CF  # PostStartContainer (7) for cpusets a start missed
    for event in translate.HANDLED_EVENTS:
        assert translate.EVENT_MASK & (1 << (event - 1))
    for event in (api.POST_CREATE_CONTAINER, api.START_CONTAINER, api.POST_UPDATE_CONTAINER):
        assert not translate.EVENT_MASK & (1 << (event - 1))


def test_live_containers_of_a_synchronize():
    a, b = msg.pod("a"), msg.pod("b")
    late = msg.container(a, "late", state=api.CONTAINER_CREATED, pid=0)
    first = msg.container(a, "first", state=api.CONTAINER_RUNNING, pid=120)
    second = msg.container(b, "second", state=api.CONTAINER_RUNNING, pid=4000)
    stopped = msg.container(b, "done", state=api.CONTAINER_STOPPED, pid=0)
    orphan = msg.container(msg.pod("ghost"), "orphan", state=api.CONTAINER_RUNNING, pid=7)
    broken = msg.container(b, "broken", state=api.CONTAINER_PAUSED, pid=9, cpus="x")
    req = api.SynchronizeRequest(pods=[a, b],
                                 containers=[late, second, stopped, orphan, first, broken])
    live, ids, problems = translate.live_containers(req)
    assert [c.name for c in live] == ["first", "second", "late"]
    # Unreadable containers still count as live: they hold CPUs.
    assert ids == {late.id, first.id, second.id, orphan.id, broken.id}
    assert len(problems) == 2
    assert any("orphan" in p and "sb-ghost" in p for p in problems)
    assert any(broken.id in p and "cpus" in p for p in problems)


def test_encoded_updates_are_the_messages_built_one_at_a_time() -> None:
    pool = frozenset(range(2, 5000, 3))
    ids = ["a", "é" * 40, "x" * 300, ""]
    wire = translate.updates_wire(api.CreateContainerResponse.UPDATE_FIELD_NUMBER, ids, pool)
    reply = api.CreateContainerResponse.FromString(wire)
    assert list(reply.update) == [translate.cpuset_update(i, pool) for i in ids]
    same_length = [f"{i:064x}" for i in range(5)]  # as runtimes make ids: the one-join path
    reply = api.CreateContainerResponse.FromString(translate.updates_wire(2, same_length, pool))
    assert list(reply.update) == [translate.cpuset_update(i, pool) for i in same_length]
    assert translate.updates_wire(1, [], pool) == b""
    skipped = api.UpdateContainersRequest.FromString(translate.updates_wire(1, ids, pool, "a"))
    assert [u.container_id for u in skipped.update] == ids[1:]
