"""Machines past the kubelet's 8 NUMA nodes, where providers list bounded hints.

16 nodes: 2 sockets × 8 nodes × 4 cores × 2 threads (8 CPUs and 16 GiB a node; distances
10/11/21).
64 nodes: the ``numa64-1024`` preset, 8 sockets × 8 nodes × 8 cores × 2 threads (16 CPUs and
32 GiB a node; 10/12/32). CPUs 0 and its sibling (one core on node 0) are reserved.
"""

from __future__ import annotations

import pytest

from nri_numa.engine.admit import admit
from nri_numa.engine.config import ConfigError
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.devices import Device, Resource
from nri_numa.topology.synthetic import MachineSpec, MemorySpec, build_topology, preset_topology

from .machines import GIB, admitted, context, guaranteed_pod, static_cpu

SIXTEEN = build_topology(MachineSpec("n16", sockets=2, nodes_per_socket=8, cores_per_node=4,
                                     memory=MemorySpec(16 * GIB)))
SIXTY_FOUR = preset_topology("numa64-1024")


def engine(topology, policy: str, reserved: str, **more):
    return context(topology, **static_cpu(reserved, policy), memoryManagerPolicy="Static",
                   reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}], **more)


def node_of(topology, cpu_ids) -> set[int]:
    by_cpu = {c.id: c.numa for c in topology.cpus}
    return {by_cpu[c] for c in cpu_ids}


def test_the_kubelets_node_limit_applies_only_when_asked_for():
    engine(SIXTEEN, "single-numa-node", "0,64")  # no limit by default
    with pytest.raises(ConfigError, match="unsupported on machines with more than 8 NUMA Nodes "
                                          r"\(this machine has 16\)"):
        engine(SIXTEEN, "single-numa-node", "0,64",
               topologyManagerPolicyOptions={"max-allowable-numa-nodes": "8"})
    engine(SIXTEEN, "single-numa-node", "0,64",
           topologyManagerPolicyOptions={"max-allowable-numa-nodes": "16"})


def fill_one_pod_per_node(topology, reserved: str, per_node: int):
    """Under single-numa-node, one pod per node (per_node - 2 CPUs, memory for more than half a
    node), each on a node of its own; returns the engine and the full snapshot."""
    ctx = engine(topology, "single-numa-node", reserved)
    allocs = ctx.empty_allocations()
    memory = f"{int(per_node * 1.5)}Gi"  # more than half a node: one such pod per node
    seen = set()
    for i, _ in enumerate(topology.numa_nodes):
        result = admitted(ctx, allocs, guaranteed_pod(f"p{i}", str(per_node - 2), memory))
        placement, = result.decision.placements
        node, = placement.hint.affinity
        assert placement.hint.preferred and node not in seen
        assert node_of(topology, placement.cpus) == {node} and placement.mems == {node}
        seen.add(node)
        allocs = result.allocations
    ctx.check(allocs)
    return ctx, allocs


@pytest.mark.parametrize(("topology", "reserved", "per_node"), [
    (SIXTEEN, "0,64", 8), (SIXTY_FOUR, "0,512", 16)], ids=["16 nodes", "64 nodes"])
def test_single_numa_node_fills_the_machine_one_node_per_pod(topology, reserved, per_node):
    ctx, allocs = fill_one_pod_per_node(topology, reserved, per_node)
    refused = admit(ctx, allocs, guaranteed_pod("one-more", str(per_node - 2), "1Gi"))
    assert refused.decision.rejection.reason == "TopologyAffinityError"
    assert refused.allocations is allocs


def test_memory_that_fits_no_node_any_more_is_refused_on_16_nodes():
    ctx, allocs = fill_one_pod_per_node(SIXTEEN, "0,64", 8)
    refused = admit(ctx, allocs, guaranteed_pod("one-more", "1", "12Gi"))
    rejection = refused.decision.rejection
    assert (rejection.reason, rejection.resource) == ("UnexpectedAdmissionError", "memory")
    assert refused.allocations is allocs


def test_static_memory_without_a_topology_policy_on_64_nodes():
    ctx = context(SIXTY_FOUR, memoryManagerPolicy="Static",
                  reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}])
    placement = admitted(ctx, ctx.empty_allocations(),
                         guaranteed_pod("p", "1", "1Gi")).decision.placements[0]
    assert len(placement.mems) == 1


def test_memory_that_fits_no_node_any_more_is_refused_on_64_nodes():
    ctx, allocs = fill_one_pod_per_node(SIXTY_FOUR, "0,512", 16)
    refused = admit(ctx, allocs, guaranteed_pod("one-more", "1", "24Gi"))
    assert refused.decision.rejection.resource == "memory"


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_more_than_a_node_is_refused_by_strict_policies(policy):
    ctx = engine(SIXTEEN, policy, "0,64")
    result = admit(ctx, ctx.empty_allocations(), guaranteed_pod("big", "12", "20Gi"))
    if policy == "single-numa-node":
        rejection = result.decision.rejection
        assert rejection.reason == "TopologyAffinityError"
        assert "cpu: asked 12 exclusive CPUs; free node 0: 6 CPUs, node 1: 8 CPUs" in \
            rejection.message
        assert "memory: asked 20.0 GiB; free node 0: 15.0 GiB, node 1: 16.0 GiB" in \
            rejection.message
    else:
        # Two nodes are the fewest that hold both: restricted admits a preferred pair.
        placement = result.decision.placements[0]
        assert placement.hint.preferred and len(placement.hint.affinity) == 2
        assert node_of(SIXTEEN, placement.cpus) <= placement.hint.affinity
        assert placement.mems == placement.hint.affinity


def test_restricted_on_64_nodes_pairs_neighbouring_nodes():
    ctx = engine(SIXTY_FOUR, "restricted", "0,512")
    placement = admitted(ctx, ctx.empty_allocations(),
                         guaranteed_pod("pair", "32", "40Gi")).decision.placements[0]
    assert placement.hint.preferred and len(placement.hint.affinity) == 2
    a, b = sorted(placement.hint.affinity)
    assert SIXTY_FOUR.node(a).distances[b] == 12  # same socket
    assert node_of(SIXTY_FOUR, placement.cpus) == placement.hint.affinity
    # More than the whole machine has is refused, not crashed on.
    assert not admit(ctx, ctx.empty_allocations(), guaranteed_pod("all", "1023")).decision.admitted


@pytest.mark.parametrize(("topology", "reserved"), [(SIXTEEN, "0,64"), (SIXTY_FOUR, "0,512")],
                         ids=["16 nodes", "64 nodes"])
def test_best_effort_spreads_what_no_node_holds(topology, reserved):
    ctx = engine(topology, "best-effort", reserved)
    cpus_wanted = 8 * len(topology.numa_nodes[0].cpus)  # eight nodes' worth
    placement = admitted(ctx, ctx.empty_allocations(),
                         guaranteed_pod("wide", str(cpus_wanted), "8Gi")).decision.placements[0]
    assert len(placement.hint.affinity) == 8 and not placement.hint.preferred
    assert node_of(topology, placement.cpus) == placement.hint.affinity


def test_best_effort_keeps_aligning_after_memory_groups_exist():
    ctx = engine(SIXTEEN, "best-effort", "0,64")
    allocs = ctx.empty_allocations()
    for name, cpus, memory in (("a", "4", "4Gi"), ("b", "8", "8Gi"), ("c", "12", "20Gi")):
        allocs = admitted(ctx, allocs, guaranteed_pod(name, cpus, memory)).allocations
    # Nodes 4..11 are untouched and hold 64 CPUs: the exact merge's answer.
    placement = admitted(ctx, allocs, guaranteed_pod("wide", "64", "8Gi")).decision.placements[0]
    assert placement.hint.affinity == set(range(4, 12))


ACCEL = "example.com/accel"


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_devices_on_16_nodes_bring_the_cpus_and_memory_to_their_node(scope):
    """One device on node 3 and one on node 12: each pod asking for one lands on a device's
    node with its CPUs and memory (bounded device hints), and a third pod is refused."""
    accel = Resource(ACCEL, (Device("accel3", frozenset({3})), Device("accel12", frozenset({12}))))
    config = config_from_mapping({
        **static_cpu("0,64", "single-numa-node", topologyManagerScope=scope),
        "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]})
    ctx = EngineContext.build(SIXTEEN, config, {ACCEL: accel})
    allocs = ctx.empty_allocations()
    nodes = []
    for name in ("a", "b"):
        result = admitted(ctx, allocs, guaranteed_pod(name, "2", "2Gi", devices={ACCEL: 1}))
        placement, = result.decision.placements
        node, = placement.hint.affinity
        assert placement.devices == {ACCEL: (f"accel{node}",)}
        assert node_of(SIXTEEN, placement.cpus) == {node} and placement.mems == {node}
        nodes.append(node)
        allocs = result.allocations
    assert sorted(nodes) == [3, 12]
    ctx.check(allocs)
    refused = admit(ctx, allocs, guaranteed_pod("c", "2", "2Gi", devices={ACCEL: 1}))
    rejection = refused.decision.rejection
    assert rejection.reason == "TopologyAffinityError"
    assert f"{ACCEL}: asked 1 devices; free node 0: 0 free" in rejection.message
    assert refused.allocations is allocs
