"""nri_numa.nri.whole_pod: the pod specs the watch brings (by uid and by a static pod's mirror),
the wait for a pod not yet there, bad pods named once; the sandbox's totals; the rest of a
Guaranteed pod as one more container."""

from __future__ import annotations

import logging
import threading
import time

from nri_numa.engine.request import ContainerKind, ContainerRequest, QosClass
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.whole_pod import (FROM_API, FROM_SANDBOX, FROM_SEEN, REST_OF_POD, PodSpecs,
                                    SandboxTotals, pod_for_admission, pod_spec_from_api,
                                    sandbox_totals)
from nri_numa.runtime import RuntimePod


def pod_json(uid: str, *names: str, mirror: str = "") -> dict:
    meta = {"uid": uid, "namespace": "ns", "name": f"pod-{uid}"}
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": mirror}
    return {"metadata": meta, "spec": {"containers": [
        {"name": n, "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}} for n in names]}}


def test_a_list_replaces_and_events_add_and_remove():
    specs = PodSpecs()
    assert specs.get("a") is None and not specs.synced
    specs.handle({"kind": "pods", "pods": [pod_json("a", "app")]})
    assert specs.synced and specs.get("a").container("app").cpu_request == 1000
    specs.handle({"kind": "pod", "pod": pod_json("b", "x", "y")})
    assert [c.name for c in specs.get("b").containers] == ["x", "y"]
    specs.handle({"kind": "pod-gone", "uid": "a"})
    assert specs.get("a") is None
    specs.handle({"kind": "pods", "pods": []})  # a new list: b went meanwhile
    assert specs.get("b") is None


def test_a_static_pod_is_found_by_the_uid_the_runtime_knows():
    specs = PodSpecs()
    specs.handle({"kind": "pod", "pod": pod_json("mirror-uid", "app", mirror="static-hash")})
    assert specs.get("static-hash").uid == "mirror-uid"
    specs.handle({"kind": "pod-gone", "uid": "mirror-uid"})
    assert specs.get("static-hash") is None


def test_a_pod_not_there_yet_is_waited_for_only_once_the_node_was_listed():
    specs = PodSpecs()
    began = time.monotonic()
    assert specs.get("late", wait_s=5) is None  # never listed: nothing to wait for
    assert time.monotonic() - began < 1
    specs.handle({"kind": "pods", "pods": []})
    threading.Timer(0.05, specs.handle, ({"kind": "pod", "pod": pod_json("late", "app")},)).start()
    assert specs.get("late", wait_s=5).uid == "late"
    began = time.monotonic()
    assert specs.get("never", wait_s=0.1) is None
    assert 0.09 < time.monotonic() - began < 2


def test_a_pod_that_cannot_be_read_is_named_once(caplog):
    specs = PodSpecs()
    bad = {"metadata": {"uid": "bad", "name": "b"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]}}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            specs.handle({"kind": "pod", "pod": bad})
        specs.handle({"kind": "pod", "pod": "not a pod"})
    assert specs.get("bad") is None
    assert caplog.text.count("pod bad from the API server cannot be read") == 1
    assert "spec.containers[0].resources.limits.cpu" in caplog.text


def test_kinds_and_pod_level_resources_are_read():
    spec = pod_spec_from_api({
        "metadata": {"uid": "u", "namespace": "ns", "name": "p"},
        "spec": {"initContainers": [{"name": "side", "restartPolicy": "Always"},
                                    {"name": "setup"}],
                 "containers": [{"name": "app"}],
                 "resources": {"limits": {"cpu": "2"}}}})
    assert [(c.name, c.kind) for c in spec.containers] == [
        ("side", ContainerKind.SIDECAR), ("setup", ContainerKind.INIT), ("app", ContainerKind.APP)]
    assert spec.pod_level_resources


def test_sandbox_totals_read_quota_else_shares_and_the_memory_limit():
    sandbox = api.PodSandbox(id="s")
    assert sandbox_totals(sandbox) is None
    cpu = sandbox.linux.pod_resources.cpu
    cpu.shares.value, cpu.period.value = 1536, 100_000
    assert sandbox_totals(sandbox) == SandboxTotals(1500, 0)
    cpu.quota.value = 200_000
    sandbox.linux.pod_resources.memory.limit.value = 1 << 30
    assert sandbox_totals(sandbox) == SandboxTotals(2000, 1 << 30)
    cpu.quota.value, cpu.shares.value = -1, 2  # unlimited, no request (BestEffort)
    sandbox.linux.pod_resources.memory.ClearField("limit")
    assert sandbox_totals(sandbox) is None


GUARANTEED_POD = RuntimePod(id="sb", uid="u", name="p", namespace="ns",
                            cgroup_parent="/kubepods/podu")


def test_the_rest_of_a_guaranteed_pod_is_one_more_app_container():
    first = ContainerRequest("first", cpu_request=1000, cpu_limit=1000,
                             memory_request=1 << 30, memory_limit=1 << 30)
    pod, source = pod_for_admission(GUARANTEED_POD, [], first, SandboxTotals(4000, 3 << 30),
                                    None)
    assert source == FROM_SANDBOX and pod.qos is QosClass.GUARANTEED
    rest = pod.container(REST_OF_POD)
    assert (rest.cpu_request, rest.memory_request) == (3000, 2 << 30)
    pod, source = pod_for_admission(GUARANTEED_POD, [], first, SandboxTotals(1000, 1 << 30),
                                    None)
    assert source == FROM_SANDBOX and [c.name for c in pod.containers] == ["first"]
    pod, source = pod_for_admission(GUARANTEED_POD, [], first, None, None)
    assert source == FROM_SEEN


def test_the_spec_gives_kinds_and_keeps_the_runtimes_requests():
    spec = pod_spec_from_api({"metadata": {"uid": "u", "namespace": "ns", "name": "p"},
                              "spec": {"initContainers": [{"name": "setup"}],
                                       "containers": [{"name": "app"}]}})
    setup = ContainerRequest("setup", cpu_request=2000, cpu_limit=2000,
                             device_numa_hints={"x/y": frozenset({1})})
    pod, source = pod_for_admission(GUARANTEED_POD, [], setup, None, spec)
    assert source == FROM_API
    assert pod.container("setup").kind is ContainerKind.INIT
    assert pod.container("setup").device_numa_hints == {"x/y": frozenset({1})}
    assert [c.name for c in pod.app_containers] == ["app"]


def test_the_first_list_is_said_once(caplog):
    specs = PodSpecs()
    with caplog.at_level(logging.INFO):
        specs.handle({"kind": "pods", "pods": [pod_json("a", "app")]})
        specs.handle({"kind": "pods", "pods": []})
    assert caplog.text.count("this node's pods from the API server: 1 listed") == 1
