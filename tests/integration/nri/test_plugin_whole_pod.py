"""The whole pod at its first container (nri_numa.nri.whole_pod): under pod scope the first
container's merge decides the pod's NUMA nodes, so a pod whose later containers are larger is
refused when only the containers created so far are known, and admitted on one node, as the
kubelet admits it, when the sandbox's resources (CRI) or the API server's pod spec tell the
plugin the rest of the pod.

The machine (plugin_env.machine): NUMA node 0 has CPUs 1-3 free (CPU 0 reserved), node 1 has
CPUs 4-7 and the GPU."""

from __future__ import annotations

import logging

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import PluginError
from nri_numa.nri.whole_pod import PodSpecs, sandbox_totals
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, GIB, create, machine

POD_SCOPE = {**CONFIG, "topologyManagerScope": "pod"}
GPU_NODE = ("/dev/nvidia0", "c", 195, 0)  # the machine's GPU, on NUMA node 1


def plugin(specs: PodSpecs | None = None, **config) -> NumaPlugin:
    return NumaPlugin(machine(), config_from_mapping({**POD_SCOPE, **config}), pod_specs=specs)


def with_sandbox_resources(sandbox: api.PodSandbox, cpus: int, memory: int,
                           quota: bool = True) -> api.PodSandbox:
    """The kubelet's LinuxPodSandboxConfig.resources for a Guaranteed pod (1.23 and later):
    shares from the pod's CPU request, quota from its limit, its memory limit."""
    resources = sandbox.linux.pod_resources
    resources.cpu.shares.value = cpus * 1024
    resources.cpu.period.value = msg.PERIOD
    if quota:  # DisableCPUQuotaWithExclusiveCPUs leaves it out
        resources.cpu.quota.value = cpus * msg.PERIOD
    resources.memory.limit.value = memory
    return sandbox


def cpus_of(reply: api.CreateContainerResponse) -> str:
    return reply.adjust.linux.resources.cpu.cpus


def api_pod(uid: str, name: str, containers: list[dict], init: list[dict] | None = None,
            pod_resources: dict | None = None) -> dict:
    """A Pod as the API server returns it, as much of it as the watch sends."""
    spec: dict = {"containers": containers, "initContainers": init or []}
    if pod_resources:
        spec["resources"] = pod_resources
    return {"metadata": {"uid": uid, "namespace": "default", "name": name}, "spec": spec}


def guaranteed(name: str, cpus: int, memory: str = "1Gi", **more) -> dict:
    limits = {"cpu": str(cpus), "memory": memory, **more}
    return {"name": name, "resources": {"requests": dict(limits), "limits": limits}}


def test_without_the_rest_of_the_pod_a_larger_second_container_is_refused():
    p = plugin()
    sandbox = msg.pod("p")
    assert cpus_of(create(p, sandbox, msg.guaranteed(sandbox, "small", cpus=1))) == "1"
    with pytest.raises(PluginError, match="TopologyAffinityError"):
        create(p, sandbox, msg.guaranteed(sandbox, "large", cpus=3))


def test_the_sandbox_resources_put_the_whole_pod_on_one_node(caplog):
    p = plugin()
    sandbox = with_sandbox_resources(msg.pod("p"), cpus=4, memory=2 * GIB)
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        small = create(p, sandbox, msg.guaranteed(sandbox, "small", cpus=1))
        large = create(p, sandbox, msg.guaranteed(sandbox, "large", cpus=3))
    assert (cpus_of(small), cpus_of(large)) == ("4", "5-7")  # node 1: the only one with 4
    assert "hint NUMA 1" in caplog.text
    assert "pod known from the sandbox's resources" in caplog.text


def test_the_sandbox_cpu_request_serves_where_the_kubelet_left_the_quota_out():
    sandbox = with_sandbox_resources(msg.pod("p"), cpus=4, memory=2 * GIB, quota=False)
    assert sandbox_totals(sandbox).cpu_millicores == 4000
    p = plugin()
    assert cpus_of(create(p, sandbox, msg.guaranteed(sandbox, "small", cpus=1))) == "4"


def test_the_sandbox_resources_of_a_burstable_pod_change_nothing(caplog):
    p = plugin()
    sandbox = with_sandbox_resources(msg.pod("b", "burstable"), cpus=4, memory=2 * GIB)
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        create(p, sandbox, msg.container(sandbox, "app", cpu=500))
    assert "pod known from the containers created so far" in caplog.text


def test_a_sandbox_without_resources_is_today_behaviour():
    assert sandbox_totals(msg.pod("p")) is None


def test_the_api_spec_knows_the_devices_of_containers_not_created_yet(caplog):
    """The second container holds the GPU (node 1): the sandbox's resources carry no devices,
    the pod spec does, so only it puts the first container's CPU beside the GPU."""
    sandbox = with_sandbox_resources(msg.pod("g"), cpus=2, memory=2 * GIB)
    first = msg.guaranteed(sandbox, "first", cpus=1)
    second = msg.guaranteed(sandbox, "second", cpus=1, devices=[GPU_NODE])
    p = plugin()
    assert cpus_of(create(p, sandbox, first)) == "1"  # the sandbox alone: node 0
    with pytest.raises(PluginError, match="TopologyAffinityError"):
        create(p, sandbox, second)

    specs = PodSpecs()
    specs.handle({"kind": "pods", "pods": [api_pod(sandbox.uid, "g", [
        guaranteed("first", 1), guaranteed("second", 1, **{"nvidia.com/gpu": "1"})])]})
    p = plugin(specs)
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        assert cpus_of(create(p, sandbox, first)) == "4"
        assert cpus_of(create(p, sandbox, second)) == "5"
    assert "pod known from the API server's pod spec" in caplog.text


def test_the_api_spec_knows_init_containers_and_sidecars():
    """A sidecar (1 CPU), then an init container (3 CPUs) that runs beside it: the pod needs 4
    CPUs at once (KEP-753's rule), which only node 1 has."""
    sandbox = msg.pod("s")
    specs = PodSpecs()
    sidecar = {**guaranteed("sidecar", 1), "restartPolicy": "Always"}
    specs.handle({"kind": "pods", "pods": [api_pod(sandbox.uid, "s", [guaranteed("app", 1)],
                                                   init=[sidecar, guaranteed("setup", 3)])]})
    p = plugin(specs)
    assert cpus_of(create(p, sandbox, msg.guaranteed(sandbox, "sidecar", cpus=1))) == "4"
    assert cpus_of(create(p, sandbox, msg.guaranteed(sandbox, "setup", cpus=3))) == "5-7"
    kinds = {c.request.name: str(c.request.kind) for c in p.containers.values()}
    assert kinds == {"sidecar": "app", "setup": "app"}  # recorded as the runtime gave them


def test_a_pod_with_pod_level_resources_is_left_to_the_shared_pool(caplog):
    sandbox = msg.pod("pl")
    specs = PodSpecs()
    specs.handle({"kind": "pods", "pods": [api_pod(
        sandbox.uid, "pl", [guaranteed("app", 2)],
        pod_resources={"requests": {"cpu": "2", "memory": "2Gi"},
                       "limits": {"cpu": "2", "memory": "2Gi"}})]})
    p = plugin(specs)
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        reply = create(p, sandbox, msg.guaranteed(sandbox, "app", cpus=2))
    assert cpus_of(reply) == "0-7"  # the shared pool: no exclusive CPUs, as in the kubelet
    assert "(shared)" in caplog.text


def test_a_spec_that_does_not_name_the_container_falls_back():
    sandbox = with_sandbox_resources(msg.pod("p"), cpus=4, memory=2 * GIB)
    specs = PodSpecs()
    specs.handle({"kind": "pods", "pods": [api_pod(sandbox.uid, "p", [guaranteed("other", 1)])]})
    p = plugin(specs)
    create(p, sandbox, msg.guaranteed(sandbox, "small", cpus=1))
    assert cpus_of(create(p, sandbox, msg.guaranteed(sandbox, "large", cpus=3))) == "5-7"
