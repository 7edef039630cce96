"""Runtime containers → engine requests: QoS from the cgroup parent, CPU and memory amounts read
back from what the kubelet wrote, hugepages, pod identity."""

from __future__ import annotations

import pytest

from nri_numa.engine.request import QosClass, RequestError
from nri_numa.runtime import (RuntimeContainer, RuntimeInputError, RuntimePod, container_request,
                              cpu_limit_millicores, cpu_request_millicores, page_size_kib,
                              parse_env, pod_identity, pod_request, qos_from_cgroup_parent)

G, B, BE = QosClass.GUARANTEED, QosClass.BURSTABLE, QosClass.BEST_EFFORT
UID = "8d2c0bb4-6a8e-4b4e-9d5b-5d0c1f6a7e21"
SYSTEMD_UID = UID.replace("-", "_")
GIB = 1 << 30


@pytest.mark.parametrize("parent, qos", [
    # cgroupfs driver
    (f"/kubepods/pod{UID}", G),
    (f"/kubepods/burstable/pod{UID}", B),
    (f"/kubepods/besteffort/pod{UID}", BE),
    (f"/kubepods/burstable/pod{UID}/", B),  # a trailing slash changes nothing
    (f"/custom-root/kubepods/pod{UID}", G),  # kubelet --cgroup-root
    (f"/custom-root/kubepods/besteffort/pod{UID}", BE),
    # systemd driver: the unit alone, or at the end of its slice path
    (f"kubepods-pod{SYSTEMD_UID}.slice", G),
    (f"kubepods-burstable-pod{SYSTEMD_UID}.slice", B),
    (f"kubepods-besteffort-pod{SYSTEMD_UID}.slice", BE),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice", B),
    (f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice", G),
    # not the kubelet's: the engine computes the class from the resources
    ("", None),
    ("/", None),
    ("/machine.slice", None),
    ("system.slice", None),
    ("/kubepods", None),
    ("/kubepods/burstable", None),
    (f"/kubepods/guaranteed/pod{UID}", None),
    (f"/other/burstable/pod{UID}", None),
    (f"pod{UID}", None),
    ("machine-libpod_pod_1234.slice", None),
    (f"kubepods-special-pod{SYSTEMD_UID}.slice", None),
])
def test_qos_from_cgroup_parent(parent, qos):
    assert qos_from_cgroup_parent(parent) is qos


def kubelet_shares(millicores: int) -> int:
    """The kubelet's MilliCPUToShares (``pkg/kubelet/cm/helpers_linux.go``; docs/nri-plugin.md)."""
    return max(2, millicores * 1024 // 1000)


def test_shares_give_back_the_request_exactly():
    for millicores in range(3, 20_000):
        assert cpu_request_millicores(kubelet_shares(millicores)) == millicores, millicores


@pytest.mark.parametrize("shares, millicores", [
    (None, 0), (0, 0), (2, 0), (1024, 1000), (2048, 2000), (102, 100), (1536, 1500),
    (262144, 256000),
])
def test_cpu_request_from_shares(shares, millicores):
    assert cpu_request_millicores(shares) == millicores


@pytest.mark.parametrize("quota, period, millicores", [
    (None, 100_000, 0), (-1, 100_000, 0), (0, 100_000, 0), (100_000, None, 0),
    (100_000, 0, 0), (100_000, 100_000, 1000), (150_000, 100_000, 1500),
    (50_000, 50_000, 1000), (1_000, 100_000, 10), (250_000, 100_000, 2500),
])
def test_cpu_limit_from_quota(quota, period, millicores):
    assert cpu_limit_millicores(quota, period) == millicores


def _pod(parent: str = f"/kubepods/pod{UID}", **more) -> RuntimePod:
    return RuntimePod(id="sb1", uid=UID, name="web", namespace="shop", cgroup_parent=parent,
                      **more)


def _container(pod: RuntimePod, **resources) -> RuntimeContainer:
    return RuntimeContainer(id="c1", name="app", pod=pod, **resources)


def test_guaranteed_container_request_equals_limits():
    c = _container(_pod(), cpu_shares=2048, cpu_quota=200_000, cpu_period=100_000,
                   memory_limit=4 * GIB, hugepage_limits={2048: 1 * GIB})
    r = container_request(c, G)
    assert (r.cpu_request, r.cpu_limit) == (2000, 2000)
    assert (r.memory_request, r.memory_limit) == (4 * GIB, 4 * GIB)
    assert dict(r.hugepages_requests) == dict(r.hugepages_limits) == {2048: GIB}


def test_burstable_container_has_no_memory_request():
    # The kubelet does not pass the memory request to the runtime.
    c = _container(_pod(f"/kubepods/burstable/pod{UID}"), cpu_shares=512, cpu_quota=200_000,
                   cpu_period=100_000, memory_limit=GIB)
    r = container_request(c, B)
    assert (r.cpu_request, r.cpu_limit, r.memory_request, r.memory_limit) == (500, 2000, 0, GIB)


def test_best_effort_container_asks_for_nothing():
    c = _container(_pod(f"/kubepods/besteffort/pod{UID}"), cpu_shares=2, cpu_period=100_000,
                   cpu_quota=-1, memory_limit=0)
    r = container_request(c, BE)
    assert (r.cpu_request, r.cpu_limit, r.memory_request, r.memory_limit) == (0, 0, 0, 0)


def test_outside_kubernetes_a_limit_alone_is_the_request():
    c = _container(_pod(""), cpu_quota=300_000, cpu_period=100_000, memory_limit=2 * GIB)
    r = container_request(c, None)
    assert (r.cpu_request, r.cpu_limit, r.memory_request, r.memory_limit) == (
        3000, 3000, 2 * GIB, 2 * GIB)
    shared = container_request(_container(_pod(""), cpu_shares=1024, cpu_quota=300_000,
                                          cpu_period=100_000), None)
    assert (shared.cpu_request, shared.cpu_limit) == (1000, 3000)


def test_request_never_exceeds_a_rounded_quota():
    # 5m: shares 5 give back 5m, the kubelet's 1 ms quota floor gives a 10m limit; a quota
    # under the shares' value (odd periods) must not make an invalid request.
    c = _container(_pod(f"/kubepods/burstable/pod{UID}"), cpu_shares=1024, cpu_quota=9_000,
                   cpu_period=10_000)
    r = container_request(c, B)
    assert r.cpu_request == r.cpu_limit == 900


def test_pod_request_takes_qos_from_the_cgroup_parent():
    pod = _pod(f"/kubepods/pod{UID}", annotations={"numa.nri.io/topology-policy": "restricted"})
    # Seen alone, this container would make a Burstable pod; the kubelet says Guaranteed.
    first = container_request(_container(pod, cpu_shares=1024, cpu_quota=100_000,
                                         cpu_period=100_000), G)
    assert first.memory_limit == 0
    request = pod_request(pod, [first])
    assert request.qos is G
    assert request.qos_override is G
    assert (request.uid, request.namespace, request.name) == (UID, "shop", "web")
    assert dict(request.annotations) == {"numa.nri.io/topology-policy": "restricted"}


def test_pod_request_outside_kubernetes_computes_qos():
    pod = RuntimePod(id="abc123")
    c = container_request(_container(pod, cpu_quota=200_000, cpu_period=100_000,
                                     memory_limit=GIB), None)
    request = pod_request(pod, [c])
    assert request.qos_override is None
    assert request.qos is G
    assert (request.uid, request.namespace, request.name) == ("abc123", "default", "abc123")


def test_pod_identity_falls_back_to_the_kubelet_labels():
    pod = RuntimePod(id="sb9", labels={"io.kubernetes.pod.uid": "u9",
                                       "io.kubernetes.pod.name": "db",
                                       "io.kubernetes.pod.namespace": "data"})
    assert pod_identity(pod) == ("u9", "data", "db")


@pytest.mark.parametrize("text, kib", [
    ("2MB", 2048), ("1GB", 1048576), ("64KB", 64), ("2Mi", 2048), ("1GiB", 1048576),
    (" 2MB ", 2048), ("16GB", 16 * 1048576), ("2048KB", 2048),
])
def test_page_size(text, kib):
    assert page_size_kib(text) == kib


@pytest.mark.parametrize("text", ["", "MB", "2XB", "2", "1B", "-2MB", "2.5MB", "0MB"])
def test_bad_page_size(text):
    with pytest.raises(RuntimeInputError, match="hugepage size"):
        page_size_kib(text)


def test_parse_env():
    assert parse_env(["A=1", "B=x=y", "C=", "D", "=nameless", "A=2"]) == {
        "A": "2", "B": "x=y", "C": "", "D": ""}


@pytest.mark.parametrize("change, message", [
    ({"cpu_shares": "1024"}, "cpu_shares must be an integer"),
    ({"memory_limit": True}, "memory_limit must be an integer"),
    ({"hugepage_limits": {0: 1}}, "hugepage size 0"),
    ({"hugepage_limits": {2048: -1}}, "hugepage limit -1"),
    ({"env": {"A": 1}}, "env"),
])
def test_bad_runtime_values_are_named(change, message):
    with pytest.raises(RuntimeInputError, match=message):
        _container(_pod(), **change)


def test_empty_ids_are_refused():
    with pytest.raises(RuntimeInputError, match="pod id"):
        RuntimePod(id="")
    with pytest.raises(RuntimeInputError, match="container name"):
        RuntimeContainer(id="c", name="", pod=_pod())


def test_qos_override_must_be_a_class():
    from nri_numa.engine.request import PodRequest

    with pytest.raises(RequestError, match="qos_override 'Platinum'"):
        PodRequest("u", "ns", "p", qos_override="Platinum")


def test_qos_override_is_what_the_engine_sees():
    from nri_numa.engine.request import ContainerRequest, PodRequest, guaranteed_cpus

    c = ContainerRequest("app", cpu_request=2000, cpu_limit=2000)  # no memory limit
    computed = PodRequest("u", "ns", "p", app_containers=(c,))
    told = PodRequest("u", "ns", "p", app_containers=(c,), qos_override=G)
    assert computed.qos is B and guaranteed_cpus(computed, c) == 0
    assert told.qos is G and guaranteed_cpus(told, c) == 2
    assert PodRequest("u", "ns", "p", app_containers=(c,), qos_override="BestEffort").qos is BE
