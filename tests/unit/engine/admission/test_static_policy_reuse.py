"""The static CPU Manager's reuse of init containers' CPUs and hint-aware allocation, through
``admit``/``release``: kubelet's policy_static_test.go TestStaticPolicyReuseCPUs,
TestStaticPolicyDoNotReuseCPUs, TestTopologyAwareAllocateCPUs, and cpu_manager_test.go
TestCPUManagerAddWithInitContainers.

Upstream reserves no CPU here; a reserved twin socket (``machines.with_reserved_twin``) keeps every
original CPU available, and the topology policy ``none`` stands for the fake Topology Manager.
"""

from __future__ import annotations

import pytest

from nri_numa.engine.admit import release
from nri_numa.engine.context import EngineContext
from nri_numa.engine.request import ContainerKind
from nri_numa.topology.cpulist import format_list

from tests.unit.engine.cpu.kubelet_fixtures import DUAL_SOCKET_HT, SINGLE_SOCKET_HT

from .machines import (admitted, container, context, cpus, machine_from_cpus, pod, static_cpu,
                       with_reserved_twin)


# --- reuse of init containers' CPUs ------------------------------------------------------------

def single_socket_without_reservation() -> tuple[EngineContext, frozenset[int]]:
    layout, twin = with_reserved_twin(SINGLE_SOCKET_HT)
    return context(machine_from_cpus(layout), **static_cpu(format_list(twin))), twin


def test_static_policy_reuse_cpus():
    # SingleSocketHT, DeAllocOneInitContainer.
    ctx, twin = single_socket_without_reservation()
    request = pod("p", container("app", "2"),
                  inits=[container("initContainer-0", "4", kind=ContainerKind.INIT)])
    allocs = admitted(ctx, ctx.empty_allocations(), request).allocations
    assert allocs.shared - twin == cpus("2-3,6-7")
    allocs = release(ctx, allocs, "p", "initContainer-0")
    assert allocs.shared - twin == cpus("1-3,5-7")
    assert allocs.container("p", "initContainer-0") is None
    ctx.check(allocs)


def test_static_policy_does_not_reuse_a_sidecars_cpus():
    # SingleSocketHT, Don't reuse CPUs of a restartable init container.
    ctx, twin = single_socket_without_reservation()
    request = pod("p", container("app", "2"),
                  inits=[container("sidecar", "4", kind=ContainerKind.SIDECAR)])
    result = admitted(ctx, ctx.empty_allocations(), request)
    assert result.allocations.shared - twin == cpus("3,7")
    assert [p.cpus for p in result.decision.placements] == [cpus("0-1,4-5"), cpus("2,6")]


INIT_CASES = [
    ("No Guaranteed Init CPUs", ["100m"], ["4"], [None], ["0-1,4-5"]),
    ("Equal Number of Guaranteed CPUs", ["4"], ["4"], ["0-1,4-5"], ["0-1,4-5"]),
    ("More Init Container Guaranteed CPUs", ["6"], ["4"], ["0-2,4-6"], ["0-1,4-5"]),
    ("Less Init Container Guaranteed CPUs", ["2"], ["4"], ["0,4"], ["0-1,4-5"]),
    ("Multi Init Container Equal CPUs", ["2", "2"], ["2"], ["0,4", "0,4"], ["0,4"]),
    ("Multi Init Container Less CPUs", ["4", "4"], ["2"], ["0-1,4-5", "0-1,4-5"], ["0,4"]),
    ("Multi Init Container More CPUs", ["2", "2"], ["4"], ["0,4", "0,4"], ["0-1,4-5"]),
    ("Multi Init Container Increasing CPUs", ["2", "4"], ["6"], ["0,4", "0-1,4-5"],
     ["0-2,4-6"]),
    ("Multi Init, Multi App Container Split CPUs", ["2", "4"], ["2", "2"], ["0,4", "0-1,4-5"],
     ["0,4", "1,5"]),
]


@pytest.mark.parametrize("scope", ["container", "pod"])
@pytest.mark.parametrize(("name", "init_cpus", "app_cpus", "init_expected", "app_expected"),
                         INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_add_with_init_containers(scope, name, init_cpus, app_cpus, init_expected,
                                  app_expected):
    layout, twin = with_reserved_twin(SINGLE_SOCKET_HT)
    ctx = context(machine_from_cpus(layout),
                  **static_cpu(format_list(twin), topologyManagerScope=scope))
    request = pod("p", *(container(f"app-{i}", c) for i, c in enumerate(app_cpus)),
                  inits=[container(f"init-{i}", c, kind=ContainerKind.INIT)
                         for i, c in enumerate(init_cpus)])
    result = admitted(ctx, ctx.empty_allocations(), request)
    expected = [None if e is None else cpus(e) for e in init_expected + app_expected]
    got = [p.cpus if p.exclusive else None for p in result.decision.placements]
    assert got == expected
    used = frozenset().union(*(e for e in expected if e))
    assert result.allocations.shared == cpus("0-7") - used | twin
    ctx.check(result.allocations)


# --- TestTopologyAwareAllocateCPUs: the hint decides where CPUs come from ---------------------

# A device the container already holds on one node pulls the merged hint there (best-effort).
TOPOLOGY_AWARE_CASES = [
    ("Request 2 CPUs, No BitMask", 2, None, "0,6"),
    ("Request 2 CPUs, BitMask on Socket 0", 2, 0, "0,6"),
    ("Request 2 CPUs, BitMask on Socket 1", 2, 1, "1,7"),
    ("Request 8 CPUs, BitMask on Socket 0", 8, 0, "0-2,4,6-8,10"),
    ("Request 8 CPUs, BitMask on Socket 1", 8, 1, "0-1,3,5-7,9,11"),
]


@pytest.mark.parametrize(("name", "count", "node", "expected"), TOPOLOGY_AWARE_CASES,
                         ids=[c[0] for c in TOPOLOGY_AWARE_CASES])
def test_topology_aware_allocate_cpus(name, count, node, expected):
    layout, twin = with_reserved_twin(DUAL_SOCKET_HT)
    policy = "none" if node is None else "best-effort"
    ctx = context(machine_from_cpus(layout), **static_cpu(format_list(twin), policy))
    held = {} if node is None else {"example.com/nic": [node]}
    request = pod("p", container("main", str(count), device_numa_hints=held))
    placement = admitted(ctx, ctx.empty_allocations(), request).decision.placements[0]
    if node is not None:
        assert placement.hint.affinity == {node}
    assert placement.cpus == cpus(expected)
