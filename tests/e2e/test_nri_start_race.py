"""A BestEffort container starting while a Guaranteed one takes an exclusive CPU, on real
containerd 1.7.24 and 2.1.9 with `nri-numa run`: the shared pool's update for the starting
container can reach only containerd's stored spec (containerd applies updates to the cgroup only
once the container counts as running), leaving the exclusive CPU in its cgroup. The plugin must
send it again at PostStartContainer (nri_numa.nri.start_check).

Each round starts the BestEffort container and creates the Guaranteed one at the same moment,
from two threads, as a kubelet does for two pods applied together."""

from __future__ import annotations

import threading

import pytest

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (BESTEFFORT, EXCLUSIVE, GUARANTEED_1, SHARED_ONLY, Agent, agent,
                                 cgroup_cpus, spec_cpus, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e
ROUNDS = 20
# From both containers running to the BestEffort cgroup off the exclusive CPU: the repair is one
# UpdateContainers after PostStartContainer, milliseconds; the bound leaves room for a slow VM.
REPAIR_BOUND_S = 2.0


def one_round(client: CriClient, image: BuiltImage, layout: CgroupLayout, n: int) -> None:
    """One BestEffort and one Guaranteed pod together: once both run, the BestEffort cgroup
    leaves the exclusive CPU (without the repair it keeps CPU 0-1 while containerd's spec says
    0: seen in the first round on both versions). Both pods are removed at the end."""
    be_pod, g_pod = Pod(f"be-{n}", (BESTEFFORT,)), Pod(f"g-{n}", (GUARANTEED_1,))
    be_sandbox, g_sandbox = client.run_pod(be_pod), client.run_pod(g_pod)
    be = client.create_container(be_sandbox, be_pod.container_config("work", image.ref))
    ready = threading.Barrier(2)
    failures: list[BaseException] = []

    def start_besteffort() -> None:
        try:
            ready.wait()
            client.start_container(be)
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            failures.append(e)

    starter = threading.Thread(target=start_besteffort)
    starter.start()
    ready.wait()
    g = client.create_container(g_sandbox, g_pod.container_config("work", image.ref))
    starter.join(30)
    assert not failures, failures
    client.start_container(g)
    assert cgroup_cpus(client, layout, g) == EXCLUSIVE
    wait_until(lambda: cgroup_cpus(client, layout, be) == SHARED_ONLY, REPAIR_BOUND_S,
               f"round {n}: the BestEffort cgroup off exclusive CPU 1 (spec says "
               f"{spec_cpus(client, be)}, cgroup {cgroup_cpus(client, layout, be)})")
    for sandbox in (g_sandbox, be_sandbox):
        client.stop_pod(sandbox)
        client.remove_pod(sandbox)


def test_besteffort_and_guaranteed_created_together_never_share_the_exclusive_cpu(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    start_and_connect(containerd, agent)
    with step_times.step(containerd.version, f"{ROUNDS} BestEffort + Guaranteed rounds"):
        for n in range(ROUNDS):
            one_round(cri_client, busybox_image, cgroup_layout, n)
    print(f"containerd {containerd.version}: {ROUNDS} rounds, "
          f"{agent.log_count('sent again (changed while it started)')} cpusets sent again at start")
