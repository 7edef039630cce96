"""Drift repair on real containerd 1.7.24 and 2.1.9 with `nri-numa run`: a Guaranteed
container's cgroup cpuset is widened behind the agent's back (as a `runc update` or another
agent would), and the agent's periodic check (cpuManagerReconcilePeriod, 1 s here) puts the
ledger's cpuset back through NRI UpdateContainers."""

from __future__ import annotations

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, container_cgroup_path
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (BESTEFFORT, BOTH, EXCLUSIVE, GUARANTEED_1, SHARED_ONLY, Agent,
                                 agent, cgroup_cpus, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e
PERIOD_S = 1.0
# The check runs every PERIOD_S; the repair is one UpdateContainers after it. The margin is for
# a loaded 2-CPU machine.
REPAIR_BOUND_S = PERIOD_S + 2.0


def widen(layout: CgroupLayout, client: CriClient, container_id: str) -> None:
    path = container_cgroup_path(client.container_info(container_id))
    (layout.mount / path.lstrip("/") / "cpuset.cpus").write_text("0-1\n")
    assert cgroup_cpus(client, layout, container_id) == BOTH


def test_a_cpuset_changed_behind_the_agents_back_is_back_within_the_period(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent) -> None:
    with agent.config_file.open("a") as config:
        config.write(f'cpuManagerReconcilePeriod: "{PERIOD_S:g}s"\n')
    start_and_connect(containerd, agent)
    g_pod, be_pod = Pod("drift-g", (GUARANTEED_1,)), Pod("drift-be", (BESTEFFORT,))
    g_sandbox, be_sandbox = cri_client.run_pod(g_pod), cri_client.run_pod(be_pod)
    g = cri_client.create_container(g_sandbox, g_pod.container_config("work", busybox_image.ref))
    be = cri_client.create_container(be_sandbox,
                                     be_pod.container_config("work", busybox_image.ref))
    cri_client.start_container(g)
    cri_client.start_container(be)
    wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, g) == EXCLUSIVE
               and cgroup_cpus(cri_client, cgroup_layout, be) == SHARED_ONLY, REPAIR_BOUND_S,
               "both containers on their cpusets")
    for container_id, expected in ((g, EXCLUSIVE), (be, SHARED_ONLY)):
        widen(cgroup_layout, cri_client, container_id)
        took = wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, container_id)
                          == expected, REPAIR_BOUND_S,
                          f"container {container_id} back on its cpuset")
        print(f"containerd {containerd.version}: cpuset back after {took:.2f} s")
    assert agent.log_count("(its cgroup differed at the periodic check)") >= 2
    for sandbox in (g_sandbox, be_sandbox):
        cri_client.stop_pod(sandbox)
        cri_client.remove_pod(sandbox)
