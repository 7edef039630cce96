"""Admission properties over random machines, configurations and pod sequences (hypothesis).

Machines: 1-4 sockets × 1-4 NUMA nodes × 1-3 cores × SMT 1-2, 3 GiB and 64 MiB of 2 MiB pages
per node. Configurations: every topology policy and scope; CPU Manager none, or static with one
or two reserved CPUs and compatible policy options; Memory Manager None or Static. A sequence
admits whole pods (init, sidecar and app containers, Guaranteed, Burstable or BestEffort) and
releases pods or single containers. After every step:

* no CPU is exclusive to containers of two pods; exclusive ∪ shared ∪ reserved = online CPUs,
  and ``EngineContext.check`` passes;
* under single-numa-node every admitted placement's hint is one node (or nil on a one-node
  machine), and its exclusive CPUs and memory blocks are on that node;
* releasing a pod right after admitting it gives back the allocations from before (memory
  compared as the kubelet compares states: free and reserved as sums over a node group);
* the same sequence run again on a fresh engine gives the same decisions and allocations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from nri_numa.engine.admit import Admission, admit, release
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.memory import machine_state_difference
from nri_numa.engine.request import ContainerKind, ContainerRequest, PodRequest
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic import MachineSpec, MemorySpec, SmtLayout, build_topology

GIB = 1 << 30
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
CPU_OPTIONS = ("full-pcpus-only", "strict-cpu-reservation", "distribute-cpus-across-numa",
               "align-by-socket", "prefer-align-cpus-by-uncorecache",
               "distribute-cpus-across-cores")
INCOMPATIBLE = ({"full-pcpus-only", "distribute-cpus-across-cores"},
                {"distribute-cpus-across-numa", "distribute-cpus-across-cores"},
                {"prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"},
                {"prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa"})


@st.composite
def machines(draw) -> Topology:
    return build_topology(MachineSpec(
        name="prop", sockets=draw(st.integers(1, 4)), nodes_per_socket=draw(st.integers(1, 4)),
        cores_per_node=draw(st.integers(1, 3)), threads_per_core=draw(st.integers(1, 2)),
        smt=draw(st.sampled_from(SmtLayout)),
        memory=MemorySpec(3 * GIB, hugepages={2048: 32})))


@st.composite
def configs(draw, topology: Topology) -> dict[str, Any]:
    policy = draw(st.sampled_from(POLICIES))
    config: dict[str, Any] = {"topologyManagerPolicy": policy,
                              "topologyManagerScope": draw(st.sampled_from(("container", "pod")))}
    if draw(st.integers(0, 3)):  # mostly static: that is where CPUs become exclusive
        online = sorted(topology.online_cpus)
        reserved = draw(st.sets(st.sampled_from(online), min_size=1,
                                max_size=min(2, len(online) - 1) or 1))
        options = draw(st.sets(st.sampled_from(CPU_OPTIONS), max_size=3))
        options = {o for o in options if not any(pair <= options for pair in INCOMPATIBLE)}
        if policy == "single-numa-node":
            options.discard("align-by-socket")
        config.update(cpuManagerPolicy="static", reservedSystemCPUs=format_list(reserved),
                      cpuManagerPolicyOptions={o: "true" for o in sorted(options)})
    if draw(st.booleans()):
        config.update(memoryManagerPolicy="Static", reservedMemory=[
            {"numaNode": 0, "limits": {"memory": draw(st.sampled_from(("256Mi", "1Gi")))}}])
    return config


@st.composite
def containers(draw, name: str, kind: ContainerKind, qos: str) -> ContainerRequest:
    if qos == "BestEffort":
        return container_from_resources(name, kind, {}, {})
    cpu = draw(st.sampled_from(("500m", "1", "1", "2", "3")))
    limits = {"cpu": cpu, "memory": draw(st.sampled_from(("128Mi", "512Mi", "1Gi", "2Gi")))}
    if draw(st.integers(0, 4)) == 0:
        limits["hugepages-2Mi"] = "16Mi"
    requests = {"cpu": "100m"} if qos == "Burstable" else {}
    return container_from_resources(name, kind, requests, limits)


@st.composite
def pods(draw, uid: str) -> PodRequest:
    qos = draw(st.sampled_from(("Guaranteed", "Guaranteed", "Guaranteed", "Burstable",
                                "BestEffort")))
    kinds = draw(st.lists(st.sampled_from((ContainerKind.INIT, ContainerKind.SIDECAR)),
                          max_size=2))
    inits = tuple(draw(containers(f"init-{i}", k, qos)) for i, k in enumerate(kinds))
    apps = tuple(draw(containers(f"app-{i}", ContainerKind.APP, qos))
                 for i in range(draw(st.integers(1, 3))))
    return PodRequest(uid=uid, namespace="default", name=uid, init_containers=inits,
                      app_containers=apps)


@dataclass(frozen=True)
class Step:
    action: str  # "admit", "release" (a live pod), "release-container"
    pod: PodRequest | None = None
    index: int = 0  # which live pod (modulo their number)


@st.composite
def scenarios(draw):
    topology = draw(machines())
    config = draw(configs(topology))
    steps = []
    for i in range(draw(st.integers(1, 8))):
        action = draw(st.sampled_from(("admit", "admit", "admit", "release",
                                       "release-container")))
        steps.append(Step(action, draw(pods(f"pod-{i}")) if action == "admit" else None,
                          draw(st.integers(0, 7))))
    return topology, config, steps


# --- checks ---------------------------------------------------------------------------------------

def check_cpus(ctx: EngineContext, allocs: Allocations) -> None:
    owner: dict[int, str] = {}
    for pod_id, pod in allocs.pods.items():
        for cpu in pod.cpus_in_use():
            assert owner.setdefault(cpu, pod_id) == pod_id, \
                f"CPU {cpu} exclusive to {owner[cpu]} and {pod_id}"
    exclusive = frozenset(owner)
    assert exclusive | allocs.shared | ctx.reserved_cpus == ctx.topology.online_cpus
    assert not exclusive & (allocs.shared | ctx.reserved_cpus)
    ctx.check(allocs)


def check_single_numa_node(ctx: EngineContext, result: Admission) -> None:
    for placement in result.decision.placements:
        affinity = placement.hint.affinity
        if affinity is None:
            # Nil only when no provider cares, or when one node is the whole machine.
            assert len(ctx.numa_ids) == 1 or not placement.exclusive
            continue
        node, = affinity
        assert placement.hint.preferred
        if placement.exclusive:
            assert ctx.nodes_of_cpus(placement.cpus) == {node}
        memory = result.allocations.memory
        blocks = memory.container_blocks(result.decision.pod, placement.container) if memory \
            else None
        assert all(b.numa_affinity == (node,) for b in blocks or ())


def assert_same_allocations(got: Allocations, expected: Allocations) -> None:
    """Equal, with memory compared the kubelet's way: blocks exactly, free and reserved as sums
    over each node's group (spilling makes the split inside a group an artefact of the order
    containers came and went), and the init-container reuse entries exactly."""
    assert (got.shared, got.pods) == (expected.shared, expected.pods)
    if got.memory is None or expected.memory is None:
        assert got.memory is expected.memory
        return
    assert got.memory.blocks == expected.memory.blocks
    assert got.memory.reusable == expected.memory.reusable
    assert machine_state_difference(got.memory.nodes, expected.memory.nodes) is None


def run(topology: Topology, config: dict[str, Any], steps: list[Step]) -> list[tuple]:
    """Play the steps, checking the properties; returns what happened, for the replay."""
    ctx = EngineContext.build(topology, config_from_mapping(config))
    allocs = ctx.empty_allocations()
    check_cpus(ctx, allocs)
    live: list[PodRequest] = []
    trace = []
    for step in steps:
        if step.action == "admit":
            result = admit(ctx, allocs, step.pod)
            note(f"admit {step.pod.uid}: {result.decision.to_dict()}")
            trace.append(result.decision.to_dict())
            if not result.decision.admitted:
                assert result.allocations is allocs
                continue
            if ctx.config.topology_manager_policy == "single-numa-node":
                check_single_numa_node(ctx, result)
            assert_same_allocations(release(ctx, result.allocations, step.pod.uid), allocs)
            allocs = result.allocations
            live.append(step.pod)
        elif live:
            pod = live[step.index % len(live)]
            if step.action == "release":
                allocs = release(ctx, allocs, pod.uid)
                live.remove(pod)
            else:
                names = list(allocs.pod(pod.uid).containers)
                allocs = release(ctx, allocs, pod.uid, names[step.index % len(names)])
                if pod.uid not in allocs.pods:
                    live.remove(pod)
        check_cpus(ctx, allocs)
        trace.append(allocs.to_dict())
    return trace


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_admission_properties(scenario):
    topology, config, steps = scenario
    note(f"config: {config}")
    first = run(topology, config, steps)
    assert run(topology, config, steps) == first
