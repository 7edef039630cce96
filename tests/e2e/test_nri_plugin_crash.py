"""kill -9 of `nri-numa run` in the middle of container creations on real containerd 1.7.24 and
2.1.9, then a restart on the same state folder: the containers keep their placements, no CPU is
exclusive to two containers, and the plugin's checkpoint equals what the runtime applied.

containerd treats a plugin that dies during an event as gone: the CRI call goes on without it
(docs/nri-protocol.md §6), so a container whose creation was in flight starts unpinned, and the restarted
plugin must find it in Synchronize and place it then."""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, allowed_inside
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (BESTEFFORT, EXCLUSIVE, GUARANTEED_1, SHARED_ONLY, Agent, agent,
                                 assert_ledger_matches_runtime, live_cpusets, load_state,
                                 machine, run, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e


class Creations:
    """CRI CreateContainer calls on their own threads, so that they are in flight together."""

    def __init__(self, client: CriClient, image: BuiltImage, pods: list[Pod]) -> None:
        self.client, self.image = client, image
        self.sandboxes = {pod.name: client.run_pod(pod) for pod in pods}
        self.pods = {pod.name: pod for pod in pods}
        self.created: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.threads = [threading.Thread(target=self._create, args=(name,), daemon=True)
                        for name in self.pods]

    def _create(self, name: str) -> None:
        config = self.pods[name].container_config("work", self.image.ref)
        try:
            self.created[name] = self.client.create_container(self.sandboxes[name], config)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors[name] = repr(exc)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> dict[str, str]:
        """Join, start every container; name → container id."""
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, self.errors
        for container in self.created.values():
            self.client.start_container(container)
        return self.created


def restart_and_check(containerd: ContainerdDaemon, client: CriClient, layout: CgroupLayout,
                      agent: Agent, times: StepTimes, expected: dict[str, frozenset[int]]) -> None:
    """Start the agent again and wait for containerd to take it in (its Synchronize has moved
    every container by then); ``expected`` container → CPUs, from the cgroup and inside."""
    times.add(containerd.version, "nri-numa restart → connected",
              start_and_connect(containerd, agent))
    assert agent.log_count("synchronized:") == agent.starts
    for container, cpus in expected.items():
        assert allowed_inside(client, container).cpu_ids == cpus, container
    runtime = live_cpusets(client, layout)
    for container, cpus in expected.items():
        assert runtime[container] == cpus, container
    assert_ledger_matches_runtime(load_state(agent.state_dir, machine()), runtime)


def test_kill_right_after_a_create_reply_keeps_every_placement(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    start_and_connect(containerd, agent)
    shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    pod = Pod("g", (GUARANTEED_1,))
    guaranteed = cri_client.create_container(cri_client.run_pod(pod),
                                             pod.container_config("work", busybox_image.ref))
    agent.kill()  # the reply has reached containerd: the decision was written before it left
    cri_client.start_container(guaranteed)  # no plugin now: containerd goes on without one

    restart_and_check(containerd, cri_client, cgroup_layout, agent, step_times,
                      {guaranteed: EXCLUSIVE, shared: SHARED_ONLY})
    assert "restored 2 containers" in agent.log_text()
    assert "synchronized: 2 containers managed, shared pool 0, 0 updates" in agent.log_text()


def test_kill_while_creations_are_in_flight(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    """The agent is frozen (SIGSTOP) while two creations wait on it (one call sent to it, the
    other queued behind it in containerd), then killed: both containers are created unpinned.
    The restarted agent finds them: the Guaranteed one does not fit (the one exclusive CPU is
    taken) and joins the shared pool; nothing runs on CPU 1 but its owner."""
    start_and_connect(containerd, agent)
    owner = run(cri_client, Pod("g", (GUARANTEED_1,)), busybox_image)
    shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    burst = Creations(cri_client, busybox_image, [Pod("g2", (GUARANTEED_1,)),
                                                  Pod("be2", (BESTEFFORT,))])
    agent.freeze()  # after RunPodSandbox, which is an NRI event as well
    burst.start()
    for sandbox in burst.sandboxes.values():
        wait_until(lambda: f'CreateContainer within sandbox \\"{sandbox}\\" for container'
                   in containerd.log_text(), 5, "containerd to begin the creation")
    time.sleep(0.2)  # the first call reaches the frozen plugin; the second queues behind it
    assert not burst.created and not burst.errors, "a creation ended while the plugin was frozen"
    cut_off = "failed to handle CreateContainer request"
    before = containerd.log_text().count(cut_off)
    agent.kill()
    created = burst.finish()
    assert containerd.log_text().count(cut_off) == before + 1  # the call was in flight

    restart_and_check(containerd, cri_client, cgroup_layout, agent, step_times,
                      {owner: EXCLUSIVE, shared: SHARED_ONLY, created["g2"]: SHARED_ONLY,
                       created["be2"]: SHARED_ONLY})
    assert "pod default/g2 container work does not fit" in agent.log_text()


def test_kill_at_the_first_decision_of_a_burst(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    """Killed as soon as the first of three concurrent creations is decided, somewhere between
    the decision, the checkpoint write and the reply. Whichever it was, the restarted agent
    ends with the Guaranteed container alone on CPU 1 and the others on the shared pool."""
    start_and_connect(containerd, agent)
    shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    placed = agent.log_count("placed pod")
    burst = Creations(cri_client, busybox_image, [Pod("g", (GUARANTEED_1,)),
                                                  Pod("be2", (BESTEFFORT,)),
                                                  Pod("be3", (BESTEFFORT,))])
    burst.start()
    wait_until(lambda: agent.log_count("placed pod") > placed, 10, "a first decision",
               poll_s=0.0005)
    agent.kill()
    created = burst.finish()

    restart_and_check(containerd, cri_client, cgroup_layout, agent, step_times,
                      {shared: SHARED_ONLY, created["g"]: EXCLUSIVE,
                       created["be2"]: SHARED_ONLY, created["be3"]: SHARED_ONLY})
    # Which moment the kill hit: how much of the burst the checkpoint had.
    print([line for line in agent.log_text().splitlines() if "restored" in line])
