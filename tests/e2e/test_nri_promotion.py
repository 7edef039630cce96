"""A Guaranteed container started while `nri-numa run` was down, and adopted at Synchronize while
the one exclusive CPU was held, on real containerd 1.7.24 and 2.1.9: it runs in the shared pool
(degraded: a warning line and the gauge `nri_numa_degraded_containers`), and is moved onto the
freed CPU by the release that frees it, or, when the room appeared while the agent was down, by
the next Synchronize — read back from its cgroup and from inside it, with the decision line
`promoted` (docs/nri-plugin.md, "Degraded containers").

The bound the chaos tier (test_nri_plugin_crash.py) leaves to this file: a Guaranteed container
adopted into the shared pool is on exclusive CPUs within one Synchronize or release after CPUs
free up."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness.cgroups import CgroupLayout, allowed_inside
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (BOTH, EXCLUSIVE, GUARANTEED_1, SHARED_ONLY, Agent, agent,
                                 assert_ledger_matches_runtime, cgroup_cpus, live_cpusets,
                                 load_state, machine, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e

DEGRADED = "nri_numa_degraded_containers"
# The promotion travels in the release's own reply or in the Synchronize's: the cgroup has it
# as soon as containerd has applied that. The wait only bounds a failure.
APPLIED_WITHIN_S = 5.0
PROMOTED = ("promoted pod default/late container work: policy single-numa-node, hint NUMA any "
            "(preferred), cpus 1 (exclusive), mems unchanged")


def degraded_gauge(agent: Agent) -> float:
    """The gauge, scraped from the agent's latest start (each start takes a free port)."""
    agent.wait_log("metrics served on", count=agent.starts)
    url = re.findall(r"metrics served on (\S+)", agent.log_text())[-1]
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return next(s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == DEGRADED)


def run(client: CriClient, pod: Pod, image: BuiltImage) -> tuple[str, str]:
    sandbox = client.run_pod(pod)
    container = client.create_container(sandbox, pod.container_config("work", image.ref))
    client.start_container(container)
    return sandbox, container


class Degraded:
    """``owner`` holds CPU 1; the agent is killed; ``late`` is started without it (on every
    CPU); the agent starts again and its Synchronize adopts ``late`` into the shared pool."""

    def __init__(self, containerd: ContainerdDaemon, client: CriClient, layout: CgroupLayout,
                 image: BuiltImage, agent: Agent) -> None:
        self.client, self.layout, self.agent = client, layout, agent
        agent.extra_args = ("--metrics-address", "127.0.0.1:0")  # a free port
        start_and_connect(containerd, agent)
        self.owner_sandbox, self.owner = run(client, Pod("owner", (GUARANTEED_1,)), image)
        assert self.cpus(self.owner) == EXCLUSIVE
        agent.kill()
        self.late_sandbox, self.late = run(client, Pod("late", (GUARANTEED_1,)), image)
        assert self.cpus(self.late) == BOTH  # no plugin: containerd went on without one
        start_and_connect(containerd, agent)
        wait_until(lambda: self.cpus(self.late) == SHARED_ONLY, APPLIED_WITHIN_S,
                   "the adopted container to join the shared pool")
        log = agent.log_text()
        assert "running pod default/late container work does not fit" in log
        assert "degraded pod default/late container work: container work runs in the shared " \
               "pool without the exclusive CPUs" in log
        assert PROMOTED not in log
        assert degraded_gauge(agent) == 1

    def cpus(self, container: str) -> frozenset[int]:
        return cgroup_cpus(self.client, self.layout, container)

    def remove_owner(self) -> None:
        self.client.stop_pod(self.owner_sandbox)
        self.client.remove_pod(self.owner_sandbox)

    def assert_promoted(self, containerd: ContainerdDaemon, step_times: StepTimes,
                        step: str) -> None:
        waited = wait_until(lambda: self.cpus(self.late) == EXCLUSIVE, APPLIED_WITHIN_S,
                            "the degraded container to be moved onto the freed CPU")
        step_times.add(containerd.version, step, waited)
        assert allowed_inside(self.client, self.late).cpu_ids == EXCLUSIVE
        assert self.agent.log_count(PROMOTED) == 1
        assert degraded_gauge(self.agent) == 0
        assert_ledger_matches_runtime(load_state(self.agent.state_dir, machine()),
                                      live_cpusets(self.client, self.layout))


def test_a_degraded_container_is_promoted_by_the_release_that_frees_its_cpu(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    degraded = Degraded(containerd, cri_client, cgroup_layout, busybox_image, agent)
    synchronized = agent.log_count("synchronized:")
    degraded.remove_owner()
    degraded.assert_promoted(containerd, step_times, "owner removed → degraded one on CPU 1")
    assert agent.log_count("synchronized:") == synchronized  # no Synchronize was needed


def test_room_that_appeared_while_the_agent_was_down_is_found_at_synchronize(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    degraded = Degraded(containerd, cri_client, cgroup_layout, busybox_image, agent)
    agent.kill()
    degraded.remove_owner()  # nobody tells the agent
    assert degraded.cpus(degraded.late) == SHARED_ONLY
    start_and_connect(containerd, agent)
    degraded.assert_promoted(containerd, step_times, "restart → degraded one on CPU 1")
    assert "restored 2 containers" in agent.log_text()  # the degraded one read back
