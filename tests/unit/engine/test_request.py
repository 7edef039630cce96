"""Pod requests: manifests, defaulting, QoS, exclusive CPUs and the pod-scope totals."""

from __future__ import annotations

from typing import Any

import pytest

from nri_numa.engine.manifest import (container_from_resources, is_extended_resource,
                                      pod_from_manifest)
from nri_numa.engine.request import (ContainerKind, ContainerRequest, PodRequest, QosClass,
                                     RequestError, guaranteed_cpus, hugepage_resource_name,
                                     hugepage_size_kib, pod_device_requests, pod_guaranteed_cpus,
                                     pod_memory_requests, qos_class)

GI = 2**30
MI = 2**20


def ctr(name: str, limits: dict | None = None, requests: dict | None = None,
        restart: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox",
                         "resources": {"limits": limits or {}, "requests": requests or {}}}
    if restart:
        c["restartPolicy"] = restart
    return c


def manifest(apps: list[dict], inits: list[dict] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", **meta},
            "spec": {"initContainers": inits or [], "containers": apps}}


def guaranteed(name: str, cpu: str, memory: str = "1Gi", restart: str | None = None,
               **extra: str) -> dict[str, Any]:
    return ctr(name, {"cpu": cpu, "memory": memory, **extra}, restart=restart)


# --- building -----------------------------------------------------------------------------


def test_manifest_fields_units_and_defaults():
    pod = pod_from_manifest(manifest(
        [ctr("app", {"cpu": "2", "memory": "2Gi", "hugepages-2Mi": "4Mi", "nvidia.com/gpu": 1},
             {"cpu": "1500m", "memory": "1Gi"})],
        [ctr("setup", {"cpu": "1", "memory": "512Mi"}),
         ctr("proxy", {"cpu": "500m", "memory": "64Mi"}, restart="Always")],
        annotations={"numa.nri.io/topology-policy": "restricted"}))
    assert (pod.uid, pod.namespace, pod.name) == ("default/p", "default", "p")
    assert pod.annotations == {"numa.nri.io/topology-policy": "restricted"}
    assert [(c.name, c.kind) for c in pod.containers] == [
        ("setup", ContainerKind.INIT), ("proxy", ContainerKind.SIDECAR), ("app", ContainerKind.APP)]
    app = pod.container("app")
    assert (app.cpu_request, app.cpu_limit) == (1500, 2000)
    assert (app.memory_request, app.memory_limit) == (GI, 2 * GI)
    # Hugepages and devices default their requests to the limit.
    assert app.hugepages_requests == app.hugepages_limits == {2048: 4 * MI}
    assert app.devices == {"nvidia.com/gpu": 1}
    assert pod.container("setup").cpu_request == 1000  # request defaulted from the limit


def test_uid_and_namespace_when_given():
    pod = pod_from_manifest(manifest([ctr("a")], namespace="ml", uid="1234-abcd"))
    assert (pod.uid, pod.namespace) == ("1234-abcd", "ml")


def test_limits_only_is_guaranteed():
    pod = pod_from_manifest(manifest([guaranteed("a", "2")]))
    assert pod.qos is QosClass.GUARANTEED
    assert pod.container("a").cpu_request == 2000


def test_explicit_zero_request_is_kept():
    c = container_from_resources("a", "app", {"cpu": "0"}, {"cpu": "1", "memory": "1Gi"})
    assert (c.cpu_request, c.memory_request) == (0, GI)


@pytest.mark.parametrize("spec_change, fragment", [
    (lambda m: m["spec"]["containers"][1]["resources"]["limits"].update(cpu="abc"),
     'spec.containers[1].resources.limits.cpu: bad quantity "abc"'),
    (lambda m: m["spec"]["containers"][0]["resources"]["requests"].update(memory="-1Gi"),
     "spec.containers[0].resources.requests.memory: bad quantity \"-1Gi\": must not be negative"),
    (lambda m: m["spec"]["containers"][0]["resources"]["requests"].update(cpu="3"),
     "spec.containers[0].resources.requests.cpu: 3 must be less than or equal to the cpu limit "
     "of 1"),
    (lambda m: m["spec"]["containers"][0]["resources"]["limits"].update(cpus="1"),
     "spec.containers[0].resources.limits.cpus: 'cpus' is not a resource a container can ask for"),
    (lambda m: m["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "1.5"}),
     "spec.containers[0].resources.limits.nvidia.com/gpu: bad quantity \"1.5\": must be a whole "
     "number"),
    (lambda m: m["spec"]["containers"][0]["resources"]["requests"].update({"nvidia.com/gpu": 1}),
     "spec.containers[0].resources.requests.nvidia.com/gpu: a limit must be set"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(
        limits={"example.com/nic": 2}, requests={"example.com/nic": 1}),
     "spec.containers[0].resources.requests.example.com/nic: 1 must be equal to the "
     "example.com/nic limit of 2"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(
        limits={"hugepages-2Mi": "4Mi"}, requests={"hugepages-2Mi": "2Mi"}),
     "spec.containers[0].resources.requests.hugepages-2Mi: 2Mi must be equal to the "
     "hugepages-2Mi limit of 4Mi"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(
        limits={"hugepages-2Mi": "4Mi", "hugepages-2048Ki": "4Mi"}),
     "hugepages-2048Ki and hugepages-2Mi name the same page size"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(limits={"hugepages-3": "3"}),
     "bad hugepages resource name 'hugepages-3'"),
    (lambda m: m["spec"]["containers"][0]["resources"].update(limits=["cpu"]),
     "spec.containers[0].resources.limits: must be a map"),
    (lambda m: m["spec"]["initContainers"].append(ctr("init", restart="Sometimes")),
     "spec.initContainers[0].restartPolicy: 'Sometimes' is not one of Always, OnFailure, Never"),
    (lambda m: m["spec"]["initContainers"].append(ctr("init", restart=["Always"])),
     "spec.initContainers[0].restartPolicy: ['Always'] is not one of"),
    (lambda m: m["spec"]["initContainers"].append(ctr("init", restart={"x": 1})),
     "spec.initContainers[0].restartPolicy: {'x': 1} is not one of"),
    (lambda m: m["spec"]["containers"][1].update(name="a"),
     "two containers are named a"),
    (lambda m: m["spec"]["containers"][1].pop("name"),
     "spec.containers[1].name: must be a non-empty string, not None"),
    (lambda m: m["spec"].update(containers=[]),
     "spec.containers: a pod needs at least one container"),
    (lambda m: m["spec"].pop("containers"), "spec.containers: missing"),
    (lambda m: m.pop("spec"), "spec: missing"),
    (lambda m: m["metadata"].pop("name"), "metadata.name: must be a non-empty string"),
    (lambda m: m["metadata"].update(annotations={"x": 1}),
     "metadata.annotations['x']: must be a non-empty string, not 1"),
    (lambda m: m["spec"].update(resources={"limits": {"cpu": "2"}}),
     "spec.resources: pod-level resources are not supported"),
    (lambda m: m.update(kind="Deployment"), "kind: expected Pod, not 'Deployment'"),
])
def test_manifest_errors_name_the_field(spec_change, fragment):
    m = manifest([guaranteed("a", "1"), guaranteed("b", "1")])
    spec_change(m)
    with pytest.raises(RequestError) as e:
        pod_from_manifest(m)
    assert fragment in str(e.value)


def test_manifest_must_be_a_mapping():
    with pytest.raises(RequestError, match="pod: must be a map, not list"):
        pod_from_manifest([])


def test_extended_resources_and_ephemeral_storage():
    c = container_from_resources("a", ContainerKind.APP, {},
                                 {"ephemeral-storage": "1Gi", "nvidia.com/gpu": "2",
                                  "example.com/vf": 1})
    assert c.devices == {"nvidia.com/gpu": 2, "example.com/vf": 1}  # storage is not a device
    assert is_extended_resource("nvidia.com/gpu")
    assert not is_extended_resource("kubernetes.io/foo")
    assert not is_extended_resource("node.kubernetes.io/foo")
    assert not is_extended_resource("requests.nvidia.com/gpu")
    assert not is_extended_resource("cpu")


@pytest.mark.parametrize("name, kib", [("hugepages-2Mi", 2048), ("hugepages-1Gi", 1048576),
                                       ("hugepages-2048Ki", 2048), ("hugepages-64Ki", 64)])
def test_hugepage_names(name, kib):
    assert hugepage_size_kib(name) == kib
    assert hugepage_size_kib(hugepage_resource_name(kib)) == kib


@pytest.mark.parametrize("name", ["hugepages-abc", "hugepages-0", "hugepages-100", "hugepages-"])
def test_bad_hugepage_names(name):
    with pytest.raises(RequestError, match="bad hugepages resource name"):
        hugepage_size_kib(name)


def test_canonical_hugepage_names():
    assert hugepage_resource_name(2048) == "hugepages-2Mi"
    assert hugepage_resource_name(1048576) == "hugepages-1Gi"
    assert hugepage_resource_name(64) == "hugepages-64Ki"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"cpu_request": -1}, "cpu_request must be a non-negative integer"),
    ({"memory_limit": True}, "memory_limit must be a non-negative integer"),
    ({"cpu_request": 2000, "cpu_limit": 1000}, "cpu request 2000 must be less than or equal"),
    ({"hugepages_requests": {0: 1}}, "hugepage size 0"),
    ({"devices": {"nvidia.com/gpu": -1}}, "devices['nvidia.com/gpu']"),
    ({"device_numa_hints": {"nvidia.com/gpu": {-1}}}, "must hold NUMA node ids"),
    ({"kind": "job"}, "kind 'job' is not one of init, sidecar, app"),
    ({"name": ""}, "container name must be a non-empty string"),
])
def test_container_request_checks(kwargs, fragment):
    with pytest.raises(RequestError) as e:
        ContainerRequest(**{"name": "a", **kwargs})
    assert fragment in str(e.value)


def test_container_request_freezes_its_maps():
    hints = {"nvidia.com/gpu": [1, 0]}
    c = ContainerRequest("a", kind="sidecar", devices={"nvidia.com/gpu": 2},
                         device_numa_hints=hints)
    hints["nvidia.com/gpu"].append(3)
    assert c.kind is ContainerKind.SIDECAR and c.is_init
    assert c.device_numa_hints == {"nvidia.com/gpu": frozenset({0, 1})}
    with pytest.raises(TypeError):
        c.devices["x"] = 1  # type: ignore[index]


def test_pod_request_checks():
    app, init = ContainerRequest("a"), ContainerRequest("i", kind=ContainerKind.INIT)
    with pytest.raises(RequestError, match="init container a has kind app"):
        PodRequest("u", "ns", "p", init_containers=(app,))
    with pytest.raises(RequestError, match="app container i has kind init"):
        PodRequest("u", "ns", "p", app_containers=(init,))
    with pytest.raises(RequestError, match="pod uid must be a non-empty string"):
        PodRequest("", "ns", "p")
    pod = PodRequest("u", "ns", "p", (init,), (app,))
    assert pod.container("i") is init
    with pytest.raises(KeyError, match="has no container 'x'"):
        pod.container("x")


# --- QoS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("apps, inits, qos", [
    ([ctr("a")], [], QosClass.BEST_EFFORT),
    ([ctr("a", {"nvidia.com/gpu": 1, "ephemeral-storage": "1Gi"})], [], QosClass.BEST_EFFORT),
    ([ctr("a", {"cpu": "0", "memory": "0"})], [], QosClass.BEST_EFFORT),  # zero is "not set"
    ([guaranteed("a", "1"), guaranteed("b", "500m")], [], QosClass.GUARANTEED),
    ([ctr("a", {"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1024Mi"})], [],
     QosClass.GUARANTEED),
    ([guaranteed("a", "1")], [guaranteed("i", "2")], QosClass.GUARANTEED),
    ([guaranteed("a", "1")], [guaranteed("s", "1", restart="Always")], QosClass.GUARANTEED),
    ([ctr("a", requests={"cpu": "1"})], [], QosClass.BURSTABLE),
    ([ctr("a", {"cpu": "2", "memory": "1Gi"}, {"cpu": "1"})], [], QosClass.BURSTABLE),
    ([ctr("a", {"cpu": "1"})], [], QosClass.BURSTABLE),  # no memory limit
    ([ctr("a", {"cpu": "1", "memory": "1Gi"}, {"cpu": "0"})], [], QosClass.BURSTABLE),
    ([guaranteed("a", "1"), ctr("b")], [], QosClass.BURSTABLE),  # b has no limits
    ([guaranteed("a", "1")], [ctr("i", requests={"memory": "1Gi"})], QosClass.BURSTABLE),
])
def test_qos_class(apps, inits, qos):
    pod = pod_from_manifest(manifest(apps, inits))
    assert qos_class(pod) is qos
    assert pod.qos is qos


# --- exclusive CPUs -----------------------------------------------------------------------


def test_guaranteed_cpus_per_container():
    pod = pod_from_manifest(manifest([guaranteed("whole", "2"), guaranteed("part", "1500m")]))
    assert guaranteed_cpus(pod, pod.container("whole")) == 2
    assert guaranteed_cpus(pod, pod.container("part")) == 0  # not an integer: shared pool
    burstable = pod_from_manifest(manifest([ctr("a", {"cpu": "2"})]))
    assert guaranteed_cpus(burstable, burstable.container("a")) == 0


@pytest.mark.parametrize("inits, apps, cpus", [
    ([], ["1", "2"], 3),
    ([("i", "4", None)], ["1", "2"], 4),
    ([("s", "1", "Always"), ("i", "2", None)], ["1"], 3),  # init runs beside the sidecar
    ([("i", "2", None), ("s", "1", "Always")], ["1"], 2),  # the sidecar starts after it
    ([("s1", "2", "Always"), ("s2", "3", "Always")], ["1"], 6),
    ([("s", "1", "Always"), ("i1", "1", None), ("i2", "5", None)], ["1", "1"], 6),
    ([("i", "1500m", None)], ["1"], 1),  # a fractional init container asks for none
    ([], ["1500m", "2"], 2),
])
def test_pod_guaranteed_cpus(inits, apps, cpus):
    pod = pod_from_manifest(manifest(
        [guaranteed(f"a{i}", cpu) for i, cpu in enumerate(apps)],
        [guaranteed(name, cpu, restart=restart) for name, cpu, restart in inits]))
    assert pod.qos is QosClass.GUARANTEED
    assert pod_guaranteed_cpus(pod) == cpus


def test_pod_guaranteed_cpus_is_zero_unless_guaranteed():
    pod = pod_from_manifest(manifest([guaranteed("a", "2"), ctr("b", requests={"cpu": "1"})]))
    assert pod_guaranteed_cpus(pod) == 0


# --- memory and device totals -------------------------------------------------------------


def test_pod_memory_requests_per_resource():
    pod = pod_from_manifest(manifest(
        [guaranteed("a", "1", "2Gi", **{"hugepages-1Gi": "2Gi"}),
         guaranteed("b", "1", "1Gi", **{"hugepages-1Gi": "1Gi"})],
        [guaranteed("big", "1", "8Gi", **{"hugepages-1Gi": "1Gi", "hugepages-2Mi": "8Mi"}),
         guaranteed("side", "1", "1Gi", restart="Always", **{"hugepages-1Gi": "1Gi"})]))
    assert pod_memory_requests(pod) == {
        "memory": 8 * GI,  # the init container needs more than apps + sidecar (4Gi)
        "hugepages-1Gi": 4 * GI,  # apps 3Gi + sidecar 1Gi beat the init container's 1Gi
        # hugepages-2Mi is asked for by an init container only, so the kubelet leaves it out
    }
    assert pod.container("a").memory_requests() == {"memory": 2 * GI, "hugepages-1Gi": 2 * GI}


def test_memory_requests_sidecar_before_init():
    pod = pod_from_manifest(manifest(
        [guaranteed("a", "1", "1Gi")],
        [guaranteed("side", "1", "2Gi", restart="Always"), guaranteed("init", "1", "3Gi")]))
    assert pod_memory_requests(pod) == {"memory": 5 * GI}  # init 3Gi beside the 2Gi sidecar


def test_pod_device_requests():
    pod = pod_from_manifest(manifest(
        [ctr("a", {"nvidia.com/gpu": 1}), ctr("b", {"nvidia.com/gpu": 2, "example.com/vf": 1})],
        [ctr("prep", {"nvidia.com/gpu": 4, "example.com/fpga": 1}),
         ctr("side", {"example.com/vf": 2}, restart="Always")]))
    assert pod_device_requests(pod) == {
        "nvidia.com/gpu": 4,  # max(init 4, apps 3)
        "example.com/fpga": 1,  # init-only device resources count (PodLimits)
        "example.com/vf": 3,  # app 1 + sidecar 2
    }
