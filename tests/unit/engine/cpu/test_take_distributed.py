"""take_cpus with distribute_across_numa: the kubelet's cases (TestTakeByTopologyNUMADistributed)
plus hand-worked cases where this code deliberately differs from the Go code, and properties.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.cpu import CPUTopology, cpu_topology, take_cpus
from nri_numa.engine.cpu import distributed

from .kubelet_fixtures import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_HT,
    DUAL_SOCKET_MULTI_NUMA_HT_LARGE,
    MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    SINGLE_SOCKET_HT,
    cpus,
)
from .test_take_packed import COMMON_CASES

# (name, topology, available, count, cpu group size, expected)
EXTENDED_CASES = [(name, topo, available, count, 1, expected)
                  for name, topo, available, count, expected in COMMON_CASES] + [
    ("4 cores, 2 on each NUMA node", DUAL_SOCKET_HT, "0-11", 8, 1, "0,6,2,8,1,7,3,9"),
    ("32 cores, 8 on each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 64, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
    ("24 cores, 8 on each of the first 3 nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 48, 1,
     "0-7,10-17,20-27,40-47,50-57,60-67"),
    ("24 cores, first 3 nodes, all but 2 of node 0", DUAL_SOCKET_MULTI_NUMA_HT,
     "1-29,32-39,41-69,72-79", 48, 1, "1-8,10-17,20-27,41-48,50-57,60-67"),
    ("24 cores, last 3 nodes though node 0 could hold 8", DUAL_SOCKET_MULTI_NUMA_HT,
     "2-29,31-39,42-69,71-79", 48, 1, "10-17,20-27,31-38,50-57,60-67,71-78"),
    ("8 cores, 2 on each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71", 16, 1,
     "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71"),
]

DISTRIBUTED_CASES = EXTENDED_CASES + [
    ("one cpu, core from socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, 1, "1"),
    ("one cpu, group size 2 falls back to packed", DUAL_SOCKET_HT, "1-5,7-11", 1, 2, "2"),
    ("13 cores over the first 2 nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 26, 1,
     "0-6,10-16,40-45,50-55"),
    ("13 cores over the first 2 nodes, groups of 2", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 26, 2,
     "0-6,10-15,40-46,50-55"),
    ("31 cores, 15 each, 1 spills to nodes 0 and 1", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76"),
    ("31 cores, 14 each, 2 spill to nodes 0, 1, 2", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 2,
     "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
    ("31 cores, spill to nodes 2 and 3 to keep balance", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-8,10-18,20-39,40-48,50-58,60-79", 62, 1,
     "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77"),
    ("31 cores, spill to nodes 0, 2, 3, groups of 2", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-8,10-18,20-39,40-48,50-58,60-79", 62, 2,
     "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77"),
    ("remainder only on nodes that can hold it", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76", 34, 1,
     "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74"),
    ("failure seen on a live machine", DUAL_SOCKET_MULTI_NUMA_HT_LARGE,
     "0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,101-111,"
     "229-239,126,127,254,255", 28, 1, "43-47,75-79,96,101-105,171-174,203-206,229-232"),
]


@pytest.mark.parametrize("name, topo, available, count, group, expected", DISTRIBUTED_CASES,
                         ids=[c[0] for c in DISTRIBUTED_CASES])
def test_distributed(name, topo, available, count, group, expected):
    chosen = take_cpus(topo, cpus(available), count, distribute_across_numa=True,
                       cpu_group_size=group)
    assert chosen == cpus(expected)


@pytest.mark.parametrize("name, topo, available, count, group, expected", DISTRIBUTED_CASES,
                         ids=[c[0] for c in DISTRIBUTED_CASES])
def test_direct_plan_agrees_with_the_search(monkeypatch, name, topo, available, count, group,
                                            expected):
    """With the search switched off, the computed optimum gives the kubelet's answers too."""
    monkeypatch.setattr(distributed, "SEARCH_BUDGET", 0)
    chosen = take_cpus(topo, cpus(available), count, distribute_across_numa=True,
                       cpu_group_size=group)
    assert chosen == cpus(expected)


def _grid(nodes: int, cores_per_node: int, smt: int) -> CPUTopology:
    """One socket, ``nodes`` NUMA nodes of ``cores_per_node`` cores; CPU c + k*physical is
    thread k of core c."""
    physical = nodes * cores_per_node
    return cpu_topology({"cpu": c + t * physical, "core": c, "socket": 0,
                         "numa": c // cores_per_node}
                        for c in range(physical) for t in range(smt))


def test_best_combination_is_the_one_used():
    """Six equal nodes of 4 CPUs, 16 wanted: every 4-node combination scores the same, so the
    first, nodes 0-3, wins. (The Go iterator's shared slices would hand back nodes 0, 1, 2, 5:
    the last node tried overwrites the remembered fourth member.)"""
    topo = _grid(6, 4, 1)
    chosen = take_cpus(topo, range(24), 16, distribute_across_numa=True)
    assert chosen == cpus("0-15")


def test_remainder_subset_without_whole_groups_is_skipped():
    """Four nodes of 4 cores x 2 threads (siblings c, c+16), three CPUs busy on each so 5 are
    free; 14 CPUs in groups of 2. k=2, 3 cannot hold 7 groups; k=4: share 2 each, remainder 6
    (3 groups). Remainder subsets of 4 and 3 nodes leave (1,1,1,3) free, balance 0.866; a subset
    of 2 nodes has 3+3 >= 6 CPUs but only 2 groups (the Go loop spins forever there) and is
    skipped. The 4-node subset comes first: nodes 0, 1, 2 give a second core. Inside a node the
    packed algorithm takes its wholly free cores, 4n+2 then 4n+3."""
    topo = _grid(4, 4, 2)
    busy = {cpu for n in range(4) for cpu in (4 * n, 4 * n + 1, 4 * n + 16)}
    available = topo.cpu_ids() - busy
    chosen = take_cpus(topo, available, 14, distribute_across_numa=True, cpu_group_size=2)
    assert chosen == cpus("2,3,18,19,6,7,22,23,10,11,26,27,14,30")


def test_many_nodes_stay_fast():
    """64 nodes of 16 CPUs, half the machine wanted: C(64, 32) combinations are out of reach for
    the search, so the optimum is computed; every node gives 16 or none."""
    topo = _grid(64, 8, 2)
    start = time.perf_counter()
    chosen = take_cpus(topo, topo.cpu_ids(), 512, distribute_across_numa=True, cpu_group_size=2)
    assert time.perf_counter() - start < 20.0  # a search of C(64, 32) would never finish
    per_node = [len(chosen & topo.cpus_in_numa_nodes([n])) for n in range(64)]
    assert sorted(set(per_node)) == [0, 16] and per_node.count(16) == 32


# --- properties -------------------------------------------------------------------------------

@st.composite
def requests(draw):
    topo = draw(st.sampled_from([DUAL_SOCKET_HT, DUAL_SOCKET_MULTI_NUMA_HT, SINGLE_SOCKET_HT,
                                 MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT]))
    available = draw(st.sets(st.sampled_from(sorted(topo.cpu_ids()))))
    group = draw(st.sampled_from([1, topo.cpus_per_core]))
    count = draw(st.integers(0, len(available)))
    return topo, frozenset(available), count, group


@settings(max_examples=120, deadline=None)
@given(requests())
def test_result_is_a_deterministic_subset_of_the_requested_size(case):
    topo, available, count, group = case
    chosen = take_cpus(topo, available, count, distribute_across_numa=True, cpu_group_size=group)
    assert chosen <= available
    assert len(chosen) == count
    assert take_cpus(topo, set(available), count, distribute_across_numa=True,
                     cpu_group_size=group) == chosen


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4))
def test_whole_machine_requests_are_even(nodes_wanted, cores_per_node):
    """On an empty machine of equal nodes, a request of whole nodes' worth in groups of a core
    lands on exactly that many nodes, the same number of CPUs on each."""
    topo = _grid(6, cores_per_node, 2)
    count = nodes_wanted * cores_per_node * 2
    chosen = take_cpus(topo, topo.cpu_ids(), count, distribute_across_numa=True, cpu_group_size=2)
    per_node = [len(chosen & topo.cpus_in_numa_nodes([n])) for n in range(6)]
    assert sorted(per_node, reverse=True)[:nodes_wanted] == [cores_per_node * 2] * nodes_wanted
    assert sum(per_node) == count
