"""The Memory Manager (Static) and the device provider through admission.

Memory machine: the kubelet's dual-socket HT layout with 8 GiB per node, two 1 GiB hugepages per
node and 1 GiB reserved on node 0, so regular memory has 5 GiB allocatable on node 0 and 6 GiB on
node 1. GPUs: the DGX-H100-like preset, four H100s per NUMA node, CPUs 0 and 112 reserved.
"""

from __future__ import annotations

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.hints import Hint
from nri_numa.engine.memory import Block
from nri_numa.engine.providers.memory import MemoryProvider
from nri_numa.topology.synthetic import preset_topology

from tests.unit.engine.cpu.kubelet_fixtures import DUAL_SOCKET_HT

from .machines import (GIB, admitted, container, context, guaranteed_pod, machine_from_cpus, pod,
                       static_cpu)

MEMORY_MACHINE = machine_from_cpus(DUAL_SOCKET_HT, memory_bytes=8 * GIB,
                                   hugepages={1048576: 2})
GPU = "nvidia.com/gpu"
DGX = preset_topology("dgx-h100")
GPU_NODE = {g.uuid: g.numa_node for g in DGX.gpus}


def memory_engine(policy: str, scope: str = "container"):
    return context(MEMORY_MACHINE, **static_cpu("0", policy, topologyManagerScope=scope),
                   memoryManagerPolicy="Static",
                   reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}])


def free_memory(allocs, node: int, resource: str = "memory") -> int:
    return allocs.memory.nodes[node].tables[resource].free


# --- Memory Manager -------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
def test_mems_are_the_nodes_of_the_memory_blocks(policy):
    ctx = memory_engine(policy)
    request = guaranteed_pod("m", "2", "6Gi", hugepages={"hugepages-1Gi": "1Gi"})
    result = admitted(ctx, ctx.empty_allocations(), request)
    placement, = result.decision.placements
    blocks = result.allocations.memory.container_blocks("m", "main")
    nodes = {n for b in blocks for n in b.numa_affinity}
    assert placement.mems == nodes
    if policy != "none":
        # Only node 1 holds 6 GiB: memory decides the node, and the CPUs follow it.
        assert nodes == {1} and placement.hint.affinity == {1} and placement.hint.preferred
        assert sorted(blocks, key=lambda b: b.type) == [
            Block((1,), "hugepages-1Gi", GIB), Block((1,), "memory", 6 * GIB)]
        assert placement.cpus <= {1, 3, 5, 7, 9, 11}
    assert free_memory(result.allocations, 1) + free_memory(result.allocations, 0) == 5 * GIB
    ctx.check(result.allocations)


def test_memory_across_two_nodes_is_best_effort_only():
    request = guaranteed_pod("m", "2", "8Gi")
    for policy in ("restricted", "single-numa-node"):
        ctx = memory_engine(policy)
        rejection = admit(ctx, ctx.empty_allocations(), request).decision.rejection
        assert rejection.reason == "TopologyAffinityError"
        assert rejection.message.endswith(
            "memory: asked 8.0 GiB; free node 0: 5.0 GiB, node 1: 6.0 GiB")
    ctx = memory_engine("best-effort")
    allocs = admitted(ctx, ctx.empty_allocations(), request).allocations
    assert allocs.memory.container_blocks("m", "main") == (Block((0, 1), "memory", 8 * GIB),)
    assert [allocs.memory.nodes[n].cells for n in (0, 1)] == [(0, 1), (0, 1)]
    # A node of a group is only used with its whole group from now on.
    small = admitted(ctx, allocs, guaranteed_pod("s", "1", "1Gi")).decision.placements[0]
    assert small.mems == {0, 1} and small.hint.affinity == {0, 1}


def test_memory_refusal_names_the_resource_and_the_free_memory_of_each_node():
    ctx = memory_engine("single-numa-node")
    allocs = ctx.empty_allocations()
    for name, size in (("four", "4Gi"), ("five", "5Gi")):  # node 0 takes 4 of 5, node 1 5 of 6
        allocs = admitted(ctx, allocs, guaranteed_pod(name, "1", size)).allocations
    refused = admit(ctx, allocs, guaranteed_pod("more", "1", "2Gi"))
    rejection = refused.decision.rejection
    # No mask has the memory free, which (as in the kubelet) means "no preference" to the merge;
    # the allocation then fails.
    assert (rejection.reason, rejection.resource) == ("UnexpectedAdmissionError", "memory")
    assert "[memorymanager]" in rejection.message
    assert rejection.message.endswith(
        "memory: asked 2.0 GiB; free node 0: 1.0 GiB, node 1: 1.0 GiB")
    assert refused.allocations is allocs


def test_pods_the_memory_manager_does_not_manage_get_no_blocks_and_keep_the_runtimes_mems():
    ctx = memory_engine("single-numa-node")
    burstable = pod("b", container("main", "2", "1Gi", request_cpu="1"))
    shared = admitted(ctx, ctx.empty_allocations(), guaranteed_pod("g", "500m")).allocations
    result = admitted(ctx, shared, burstable)
    assert result.decision.placements[0].mems is None
    assert result.allocations.memory.container_blocks("b", "main") is None
    # A Guaranteed container in the shared pool still has its memory pinned by its blocks.
    assert shared.memory.container_blocks("g", "main") == (Block((0,), "memory", GIB),)


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_releasing_gives_the_memory_back(scope):
    ctx = memory_engine("restricted", scope)
    empty = ctx.empty_allocations()
    request = pod("p", container("a", "1", "2Gi", hugepages={"hugepages-1Gi": "1Gi"}),
                  container("b", "1", "1Gi"))
    allocs = admitted(ctx, empty, request).allocations
    assert free_memory(allocs, 0) == 2 * GIB and free_memory(allocs, 0, "hugepages-1Gi") == GIB
    half = release(ctx, allocs, "p", "a")
    ctx.check(half)
    assert free_memory(half, 0) == 4 * GIB and free_memory(half, 0, "hugepages-1Gi") == 2 * GIB
    assert release(ctx, half, "p") == empty


def test_releasing_a_pod_drops_its_memory_reuse_entry():
    ctx = memory_engine("best-effort")
    empty = ctx.empty_allocations()
    request = pod("p", container("app", "1", "1Gi"),
                  inits=[container("init", "1", "3Gi", kind="init")])
    allocs = admitted(ctx, empty, request).allocations
    assert release(ctx, allocs, "p") == empty


def test_admitting_another_pod_keeps_the_memory_reuse_entries_of_others():
    ctx = memory_engine("best-effort")
    with_init = pod("p", container("app", "1", "1Gi"),
                    inits=[container("init", "1", "3Gi", kind="init")])
    before = admitted(ctx, ctx.empty_allocations(), with_init).allocations
    during = admitted(ctx, before, guaranteed_pod("q", "1", "1Gi")).allocations
    assert release(ctx, during, "q") == before


def test_a_pod_whose_memory_is_placed_hints_the_nodes_of_its_blocks():
    """The kubelet regenerates an allocated pod's memory hints from its blocks instead of
    computing them afresh (a pod-scope merge of a pod placed without a kept pod hint)."""
    ctx = memory_engine("single-numa-node", "pod")
    request = guaranteed_pod("p", "2", "4Gi")
    allocs = admitted(ctx, ctx.empty_allocations(), request).allocations
    assert allocs.memory.container_blocks("p", "main") == (Block((0,), "memory", 4 * GIB),)
    assert MemoryProvider().pod_hints(ctx, allocs, request) == {
        "memory": [Hint(frozenset({0}), True)]}
    # Another pod of the same size is hinted afresh: only node 1 still holds 4 GiB.
    fresh = MemoryProvider().pod_hints(ctx, allocs, guaranteed_pod("q", "2", "4Gi"))
    assert {h.affinity for h in fresh["memory"] if h.preferred} == {frozenset({1})}


# --- GPUs on a DGX-H100-like machine ---------------------------------------------------------

def dgx_engine(policy: str = "single-numa-node", scope: str = "container"):
    return context(DGX, **static_cpu("0,112", policy, topologyManagerScope=scope))


def node_cpus(node: int) -> frozenset[int]:
    return frozenset(c.id for c in DGX.cpus if c.numa == node)


def test_gpus_and_cpus_are_aligned_on_one_node_under_single_numa_node():
    ctx = dgx_engine()
    allocs = ctx.empty_allocations()
    nodes = []
    for name in ("first", "second"):
        result = admitted(ctx, allocs, guaranteed_pod(name, "8", devices={GPU: 3}))
        placement, = result.decision.placements
        node, = placement.hint.affinity
        assert placement.hint.preferred
        assert {GPU_NODE[g] for g in placement.devices[GPU]} == {node}
        assert len(placement.devices[GPU]) == 3
        assert placement.cpus <= node_cpus(node) and placement.mems is None  # no Memory Manager
        nodes.append(node)
        allocs = result.allocations
    assert sorted(nodes) == [0, 1]
    ctx.check(allocs)
    third = admit(ctx, allocs, guaranteed_pod("third", "8", devices={GPU: 3}))
    assert third.decision.rejection.reason == "TopologyAffinityError"
    assert third.decision.rejection.message.endswith(
        "nvidia.com/gpu: asked 3 devices; free node 0: 1 free, node 1: 1 free")
    # One GPU per node is still free: single-GPU pods fit.
    assert admitted(ctx, allocs, guaranteed_pod("one", "1", devices={GPU: 1}))


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_a_pods_gpus_are_never_given_twice(scope):
    ctx = dgx_engine("best-effort", scope)
    request = pod("p", container("a", "2", devices={GPU: 2}), container("b", "2", devices={GPU: 2}))
    result = admitted(ctx, ctx.empty_allocations(), request)
    a, b = result.decision.placements
    assert len(set(a.devices[GPU]) | set(b.devices[GPU])) == 4
    assert {GPU_NODE[g] for g in a.devices[GPU] + b.devices[GPU]} == {0}
    freed = release(ctx, result.allocations, "p", "a")
    assert admitted(ctx, freed, guaranteed_pod("next", "1", devices={GPU: 2})).decision \
        .placements[0].devices[GPU] == a.devices[GPU]


def test_more_gpus_than_a_node_has_span_both_nodes_under_best_effort_only():
    request = guaranteed_pod("wide", "4", devices={GPU: 6})
    ctx = dgx_engine("best-effort")
    placement = admitted(ctx, ctx.empty_allocations(), request).decision.placements[0]
    assert {GPU_NODE[g] for g in placement.devices[GPU]} == {0, 1}
    assert placement.hint.affinity == {0, 1} and not placement.hint.preferred
    for policy in ("restricted", "single-numa-node"):
        ctx = dgx_engine(policy)
        assert not admit(ctx, ctx.empty_allocations(), request).decision.admitted


@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_a_device_the_container_already_holds_pulls_its_cpus_to_the_devices_node(policy):
    ctx = dgx_engine(policy)
    request = guaranteed_pod("nic", "4", device_numa_hints={"example.com/nic": [1]})
    placement = admitted(ctx, ctx.empty_allocations(), request).decision.placements[0]
    assert placement.hint.affinity == {1}
    assert placement.cpus <= node_cpus(1) and placement.mems is None  # no Memory Manager
    # Devices asked for follow the held one too.
    with_gpu = guaranteed_pod("both", "4", devices={GPU: 2},
                              device_numa_hints={"example.com/nic": [1]})
    placement = admitted(ctx, ctx.empty_allocations(), with_gpu).decision.placements[0]
    assert {GPU_NODE[g] for g in placement.devices[GPU]} == {1}


def test_held_devices_on_two_nodes_cannot_be_aligned_to_one():
    request = guaranteed_pod("split", "4", device_numa_hints={"example.com/nic": [0, 1]})
    ctx = dgx_engine("single-numa-node")
    assert admit(ctx, ctx.empty_allocations(), request).decision.rejection.reason == \
        "TopologyAffinityError"
    # Four CPUs fit on one node, so the two-node hint is not preferred for them either.
    ctx = dgx_engine("restricted")
    assert not admit(ctx, ctx.empty_allocations(), request).decision.admitted
    ctx = dgx_engine("best-effort")
    placement = admitted(ctx, ctx.empty_allocations(), request).decision.placements[0]
    assert placement.hint.affinity == {0, 1} and not placement.hint.preferred
