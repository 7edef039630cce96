"""In-place resize on real containerd 1.7.24 and 2.1.9 with `nri-numa run`: CRI
UpdateContainerResources of running containers, as the kubelet sends it for a pod resize.

This machine has 2 CPUs and CPU 0 is reserved, so CPU 1 is the only exclusive one: a grow of
the Guaranteed container would empty the shared pool and is refused, as is a shrink below its
admitted CPU and a move to the shared pool. Each refusal is the runtime's error to the CRI
caller and leaves the cgroup (cpuset and quota) as it was. A Burstable container's resize
changes its quota and keeps the shared pool as its cpuset."""

from __future__ import annotations

import grpc
import pytest

from tests.e2e.harness.cgroups import CgroupLayout, container_cgroup_path
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, Resources, linux_resources
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (BOTH, EXCLUSIVE, GUARANTEED_1, MiB, SHARED_ONLY, Agent, agent,
                                 cgroup_cpus, require_two_cpus, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e
BURSTABLE = Resources(cpu_request_m=500, cpu_limit_m=1000, memory_request=64 * MiB,
                      memory_limit=128 * MiB)


def cpu_quota(layout: CgroupLayout, client: CriClient, container_id: str) -> int:
    """The container's CFS quota in microseconds per 100 ms period (-1: none)."""
    path = container_cgroup_path(client.container_info(container_id)).lstrip("/")
    if layout.version == 2:
        quota = (layout.mount / path / "cpu.max").read_text().split()[0]
        return -1 if quota == "max" else int(quota)
    return int((layout.mount.parent / "cpu" / path / "cpu.cfs_quota_us").read_text())


def resize(client: CriClient, pod: Pod, container_id: str, resources: Resources) -> None:
    client.update_container_resources(container_id, linux_resources(resources, pod.qos))


def test_refused_resizes_fail_the_cri_call_and_change_nothing(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent) -> None:
    require_two_cpus()
    start_and_connect(containerd, agent)
    pod = Pod("resize-g", (GUARANTEED_1,))
    sandbox = cri_client.run_pod(pod)
    g = cri_client.create_container(sandbox, pod.container_config("work", busybox_image.ref))
    cri_client.start_container(g)
    wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, g) == EXCLUSIVE, 5.0,
               "the container on its exclusive CPU")
    quota = cpu_quota(cgroup_layout, cri_client, g)
    two = Resources(cpu_request_m=2000, cpu_limit_m=2000, memory_request=64 * MiB,
                    memory_limit=64 * MiB)
    shared = Resources(cpu_request_m=1500, cpu_limit_m=1500, memory_request=64 * MiB,
                       memory_limit=64 * MiB)
    for resources, why in ((two, "1 more asked, 0 free"), (shared, "InfeasibleResize")):
        with pytest.raises(grpc.RpcError) as raised:
            resize(cri_client, pod, g, resources)
        details = raised.value.details()
        print(f"containerd {containerd.version}: the CRI caller sees: {details}")
        assert "nri-numa: resize refused" in details and why in details
        assert cgroup_cpus(cri_client, cgroup_layout, g) == EXCLUSIVE
        assert cpu_quota(cgroup_layout, cri_client, g) == quota
    assert agent.log_count("refused") >= 2
    cri_client.stop_pod(sandbox)
    cri_client.remove_pod(sandbox)


def test_a_shared_container_resized_keeps_the_shared_pool_with_its_new_quota(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent) -> None:
    require_two_cpus()
    start_and_connect(containerd, agent)
    pod = Pod("resize-b", (BURSTABLE,))
    sandbox = cri_client.run_pod(pod)
    b = cri_client.create_container(sandbox, pod.container_config("work", busybox_image.ref))
    cri_client.start_container(b)
    wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, b) == BOTH, 5.0,
               "the container on the shared pool")
    assert cpu_quota(cgroup_layout, cri_client, b) == 100000
    bigger = Resources(cpu_request_m=1000, cpu_limit_m=2000, memory_request=64 * MiB,
                       memory_limit=128 * MiB)
    resize(cri_client, pod, b, bigger)
    assert cpu_quota(cgroup_layout, cri_client, b) == 200000
    assert cgroup_cpus(cri_client, cgroup_layout, b) == BOTH
    # A Guaranteed container arriving still shrinks the pool under the resized one.
    g_pod = Pod("resize-g2", (GUARANTEED_1,))
    g_sandbox = cri_client.run_pod(g_pod)
    g = cri_client.create_container(g_sandbox, g_pod.container_config("work", busybox_image.ref))
    cri_client.start_container(g)
    wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, b) == SHARED_ONLY, 5.0,
               "the resized container on the shrunken pool")
    for s in (g_sandbox, sandbox):
        cri_client.stop_pod(s)
        cri_client.remove_pod(s)
