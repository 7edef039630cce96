"""The NRI plugin as a real process (`nri-numa run`) on real containerd 1.7.24 and 2.1.9 with
runc: exclusive CPUs and the shared pool as the cgroups and the containers themselves see them,
the shared pool growing back, a refusal with the engine's reason, and a containerd restart.
Kill -9 of the plugin is in test_nri_plugin_crash.py, a hostile runtime in
test_nri_plugin_hostile.py."""

from __future__ import annotations

import time

import grpc
import pytest

from nri_numa.topology.cpulist import format_list
from tests.e2e.harness.cgroups import CgroupLayout, allowed_inside
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, Resources
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (BESTEFFORT, BOTH, EXCLUSIVE, GUARANTEED_1, GUARANTEED_2,
                                 SHARED_ONLY, Agent, agent, assert_ledger_matches_runtime,
                                 cgroup_cpus, connected_count, live_cpusets, load_state,
                                 machine, spec_cpus, start_and_connect, wait_until)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e
RECONNECT_LIMIT_S = 5.0


def create(client: CriClient, pod: Pod, image: BuiltImage) -> tuple[str, str]:
    sandbox = client.run_pod(pod)
    return sandbox, client.create_container(sandbox, pod.container_config("work", image.ref))


def run(client: CriClient, pod: Pod, image: BuiltImage) -> tuple[str, str]:
    sandbox, container = create(client, pod, image)
    client.start_container(container)
    return sandbox, container


def inside(client: CriClient, container_id: str) -> frozenset[int]:
    return allowed_inside(client, container_id).cpu_ids


def test_exclusive_cpu_shrinks_and_regrows_the_shared_pool(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    version = containerd.version
    step_times.add(version, "nri-numa start → connected", start_and_connect(containerd, agent))
    _, shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    assert cgroup_cpus(cri_client, cgroup_layout, shared) == BOTH
    assert inside(cri_client, shared) == BOTH

    with step_times.step(version, "CreateContainer, Guaranteed 1 CPU (plugin)"):
        guaranteed_sandbox, guaranteed = create(cri_client, Pod("g", (GUARANTEED_1,)),
                                                busybox_image)
    # The shared container shrank in the same step: before the new container even started.
    assert cgroup_cpus(cri_client, cgroup_layout, shared) == SHARED_ONLY
    assert spec_cpus(cri_client, guaranteed) == EXCLUSIVE
    cri_client.start_container(guaranteed)
    assert cgroup_cpus(cri_client, cgroup_layout, guaranteed) == EXCLUSIVE
    assert inside(cri_client, guaranteed) == EXCLUSIVE
    assert inside(cri_client, shared) == SHARED_ONLY
    assert "placed pod default/g container work: policy single-numa-node" in agent.log_text()
    assert "cpus 1 (exclusive), mems unchanged" in agent.log_text()
    topology = machine()
    assert_ledger_matches_runtime(load_state(agent.state_dir, topology),
                                  live_cpusets(cri_client, cgroup_layout))

    with step_times.step(version, "StopPodSandbox + RemovePodSandbox (plugin)"):
        cri_client.stop_pod(guaranteed_sandbox)
        cri_client.remove_pod(guaranteed_sandbox)
    assert cgroup_cpus(cri_client, cgroup_layout, shared) == BOTH
    assert inside(cri_client, shared) == BOTH
    state = load_state(agent.state_dir, topology)
    assert state.ledger.allocations.shared == BOTH
    assert not state.ledger.allocations.exclusive_cpus()
    assert [c.name for c in state.containers.values()] == ["work"]  # the BestEffort one
    assert_ledger_matches_runtime(state, live_cpusets(cri_client, cgroup_layout))


def test_a_pod_that_cannot_fit_is_refused_with_the_engines_reason(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent) -> None:
    start_and_connect(containerd, agent)
    _, guaranteed = run(cri_client, Pod("g", (GUARANTEED_1,)), busybox_image)
    before = load_state(agent.state_dir, machine())
    big = Pod("big", (GUARANTEED_2,))
    sandbox = cri_client.run_pod(big)
    with pytest.raises(grpc.RpcError) as refused:
        cri_client.create_container(sandbox, big.container_config("work", busybox_image.ref))
    details = refused.value.details()
    assert "nri-numa: TopologyAffinityError: container work: Resources cannot be allocated " \
           "with Topology locality (topology policy single-numa-node); cpu: asked 2 exclusive " \
           "CPUs; free node 0: 0 CPUs" in details, details
    assert cri_client.list_containers(sandbox) == []
    assert "refused pod default/big container work: TopologyAffinityError" in agent.log_text()
    after = load_state(agent.state_dir, machine())
    assert after.containers == before.containers
    assert after.ledger.allocations == before.ledger.allocations
    assert cgroup_cpus(cri_client, cgroup_layout, guaranteed) == EXCLUSIVE


def test_containerd_restart_reconnects_and_resynchronises(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    version = containerd.version
    start_and_connect(containerd, agent)
    guaranteed_sandbox, guaranteed = run(cri_client, Pod("g", (GUARANTEED_1,)), busybox_image)
    _, shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    synchronized = agent.log_count("synchronized:")
    connected = connected_count(containerd, agent)

    with step_times.step(version, "containerd restart"):
        containerd.restart()
    ready = time.monotonic()
    agent.wait_log("NRI session ended", timeout_s=5)
    waited = wait_until(lambda: connected_count(containerd, agent) > connected,
                        RECONNECT_LIMIT_S, "the plugin to reconnect after the restart")
    step_times.add(version, "plugin reconnected after containerd restart", waited)
    assert time.monotonic() - ready < RECONNECT_LIMIT_S
    assert agent.log_count("synchronized:") > synchronized
    assert "synchronized: 2 containers managed, shared pool 0, 0 updates" in agent.log_text()

    # The running containers kept their CPUs, and a new pod is placed as before.
    assert cgroup_cpus(cri_client, cgroup_layout, guaranteed) == EXCLUSIVE
    assert cgroup_cpus(cri_client, cgroup_layout, shared) == SHARED_ONLY
    _, burstable = run(cri_client, Pod("bu", (Resources(cpu_request_m=500),)), busybox_image)
    assert inside(cri_client, burstable) == SHARED_ONLY
    assert inside(cri_client, guaranteed) == EXCLUSIVE
    assert_ledger_matches_runtime(load_state(agent.state_dir, machine()),
                                  live_cpusets(cri_client, cgroup_layout))

    cri_client.stop_pod(guaranteed_sandbox)  # the pool grows back on the new connection too
    for container in (shared, burstable):
        assert inside(cri_client, container) == BOTH, format_list(inside(cri_client, container))
