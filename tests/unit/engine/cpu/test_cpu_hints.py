"""cpu_hints: the kubelet's cases (topology_hints_test.go), hand-worked cases, and properties.

Upstream compares hint lists after sorting them; cpu_hints returns them in the order the kubelet
generates them (IterateBitMasks: by size, then lexicographically), so the lists below are written
in that order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.cpu import cpu_hints, cpu_topology
from nri_numa.engine.cpu import hints as hints_module
from nri_numa.engine.hints import Hint

from .kubelet_fixtures import DUAL_SOCKET_MULTI_NUMA_HT, cpus

# returnMachineInfo(): NUMA node 0 = socket 0 = cores {0,6} {1,7} {2,8}; node 1 = socket 1 =
# cores {3,9} {4,10} {5,11}.
HINTS_MACHINE = cpu_topology({"cpu": c, "core": c % 6, "socket": c % 6 // 3, "numa": c % 6 // 3}
                             for c in range(12))


def H(nodes, preferred):
    return Hint(frozenset(nodes), preferred)


@pytest.mark.parametrize("name, available, wanted, expected", [
    ("2 of 4 on node 0, 6 on node 1", "2-11", 2, [H({0}, True), H({1}, True), H({0, 1}, False)]),
    ("5 of 4 on node 0, 6 on node 1", "2-11", 5, [H({1}, True), H({0, 1}, False)]),
    ("7 of 4 on node 0, 6 on node 1", "2-11", 7, [H({0, 1}, True)]),
    ("11 of 10", "2-11", 11, []),
    ("2 of 1 on each node", "0,3", 2, [H({0, 1}, False)]),
    ("more than available", "0-3", 5, []),
    # "Regenerate ... if already allocated": the container's own CPUs as available, no reusable.
    ("regenerate single-node hints 1/2", "0,6", 2, [H({0}, True), H({0, 1}, False)]),
    ("regenerate single-node hints 2/2", "3,9", 2, [H({1}, True), H({0, 1}, False)]),
    ("regenerate cross-NUMA hints", "0-10", 11, [H({0, 1}, True)]),
])
def test_kubelet_cases(name, available, wanted, expected):
    assert cpu_hints(HINTS_MACHINE, cpus(available), set(), wanted) == expected


ALL_WITH_NODE_0 = [{0, 1}, {0, 2}, {0, 3}, {0, 1, 2}, {0, 1, 3}, {0, 2, 3}, {0, 1, 2, 3}]


@pytest.mark.parametrize("name, align, available, wanted, expected", [
    # CPUs 2, 3 (node 0) and 11 (node 1) free: node 0 alone holds 2.
    ("align-by-socket off", False, "2,3,11", 2,
     [H({0}, True)] + [H(m, False) for m in ALL_WITH_NODE_0]),
    # {0,1} spans one socket, the one socket min affinity 1 needs: preferred too.
    ("align-by-socket on", True, "2,3,11", 2,
     [H({0}, True), H({0, 1}, True)] + [H(m, False) for m in ALL_WITH_NODE_0[1:]]),
    # 41 CPUs need 3 nodes (2 sockets); free: node 0 20, node 1 18, node 2 9, node 3 none.
    ("align-by-socket, 2 sockets needed", True, "0-28,40-57", 41,
     [H({0, 1, 2}, True), H({0, 1, 2, 3}, True)]),
])
def test_align_by_socket_cases(name, align, available, wanted, expected):
    """TestGetPodTopologyHintsWithPolicyOptions."""
    got = cpu_hints(DUAL_SOCKET_MULTI_NUMA_HT, cpus(available), set(), wanted,
                    align_by_socket=align)
    assert got == expected


def test_reusable_cpus_pin_the_mask():
    """Hand-worked: CPU 3 (node 1) is reusable, 0-2 (node 0) available, 2 wanted. {0} lacks the
    reusable CPU; {1} has it but nothing else (1 < 2); {0,1} has 1 + 3. Node 0 alone could hold
    2 on an empty machine, so min affinity is 1 and {0,1} is not preferred."""
    assert cpu_hints(HINTS_MACHINE, {0, 1, 2}, {3}, 2) == [H({0, 1}, False)]


def test_reusable_cpus_count_toward_the_request():
    """Hand-worked: reusable 0, 6 plus available 1 on node 0 hold 3."""
    assert cpu_hints(HINTS_MACHINE, {1}, {0, 6}, 3) == [H({0}, True), H({0, 1}, False)]


def test_no_request_is_no_preference():
    assert cpu_hints(HINTS_MACHINE, cpus("0-11"), set(), 0) is None


@pytest.mark.parametrize("wanted", [-1, 2.0, True])
def test_bad_request(wanted):
    with pytest.raises(ValueError, match="CPU request must be a non-negative integer"):
        cpu_hints(HINTS_MACHINE, cpus("0-11"), set(), wanted)


@pytest.mark.parametrize("available, reusable, message", [
    ([0, -2], [], "available must hold CPU ids"),
    ([0], ["1"], "reusable must hold CPU ids"),
])
def test_bad_cpu_ids(available, reusable, message):
    with pytest.raises(ValueError, match=message):
        cpu_hints(HINTS_MACHINE, available, reusable, 1)


def test_cpus_unknown_to_the_topology_are_ignored():
    assert cpu_hints(HINTS_MACHINE, {0, 99, 100}, {98}, 2) == []


def test_memory_only_nodes_are_not_in_masks():
    """Nodes without CPUs never reach the CPU topology, so masks only name nodes 0 and 2."""
    topo = cpu_topology({"cpu": c, "core": c, "socket": 0, "numa": 2 * (c // 2)} for c in range(4))
    assert cpu_hints(topo, range(4), set(), 1) == [H({0}, True), H({2}, True), H({0, 2}, False)]


# --- more NUMA nodes than can be listed -------------------------------------------------------

def _grid(nodes: int, cpus_per_node: int, sockets: int = 1):
    per_socket = nodes // sockets
    return cpu_topology({"cpu": c, "core": c, "socket": c // cpus_per_node // per_socket,
                         "numa": c // cpus_per_node} for c in range(nodes * cpus_per_node))


def test_64_nodes_small_request():
    """Hand-worked: one node of 16 holds 8 → 64 preferred single-node hints, then the all-nodes
    hint (not preferred)."""
    topo = _grid(64, 16)
    got = cpu_hints(topo, topo.cpu_ids(), set(), 8)
    assert got == [H({n}, True) for n in range(64)] + [H(range(64), False)]


def test_64_nodes_two_node_request_with_a_reusable_cpu():
    """Hand-worked: 20 CPUs need two nodes of 16; CPU 16 (node 1) is reusable, so every hint
    holds node 1: {0,1}, {1,2}, ..., {1,63} (63 pairs, preferred), then all nodes."""
    topo = _grid(64, 16)
    got = cpu_hints(topo, topo.cpu_ids() - {16}, {16}, 20)
    pairs = [H({0, 1}, True)] + [H({1, n}, True) for n in range(2, 64)]
    assert got == pairs + [H(range(64), False)]


def test_a_capped_width_keeps_the_smallest_masks(monkeypatch):
    """Hand-worked: 20 CPUs need two 16-CPU nodes, so the preferred width is 2; cut to 3 hints,
    the pairs of smallest integer value stay: {0,1} = 3, {0,2} = 5, {1,2} = 6 (not {0,3} = 9,
    which comes earlier in the kubelet's lexicographic walk). Listed in kubelet order."""
    monkeypatch.setattr(hints_module, "MAX_LISTED_HINTS", 3)
    topo = _grid(64, 16)
    got = cpu_hints(topo, topo.cpu_ids(), set(), 20)
    assert got == [H({0, 1}, True), H({0, 2}, True), H({1, 2}, True), H(range(64), False)]


@st.composite
def machines(draw):
    nodes = draw(st.integers(2, 7))
    per_node = draw(st.integers(1, 4))
    sockets = draw(st.sampled_from([s for s in (1, 2, nodes) if nodes % s == 0]))
    topo = _grid(nodes, per_node, sockets)
    available = draw(st.sets(st.sampled_from(sorted(topo.cpu_ids()))))
    rest = sorted(topo.cpu_ids() - available)
    reusable = draw(st.sets(st.sampled_from(rest), max_size=2)) if rest else set()
    request = draw(st.integers(1, nodes * per_node + 1))
    return topo, available, reusable, request


def _key(hint):
    return len(hint.affinity), sorted(hint.affinity)


@settings(max_examples=150, deadline=None)
@given(machines(), st.booleans())
def test_hints_are_upward_closed_and_in_kubelet_order(case, align):
    topo, available, reusable, request = case
    got = cpu_hints(topo, available, reusable, request, align_by_socket=align)
    assert [_key(h) for h in got] == sorted(_key(h) for h in got)
    masks = {h.affinity for h in got}
    for hint in got:
        for node in topo.numa_ids:
            assert hint.affinity | {node} in masks


@settings(max_examples=150, deadline=None)
@given(machines())
def test_narrow_listing_keeps_what_the_merge_can_prefer(case):
    """The listing used past EXACT_NODE_LIMIT, forced on small machines: an ordered sub-list of
    the exact hints holding every preferred hint, every narrowest hint and the all-nodes hint."""
    topo, available, reusable, request = case
    exact = cpu_hints(topo, available, reusable, request)
    limit = hints_module.EXACT_NODE_LIMIT
    try:
        hints_module.EXACT_NODE_LIMIT = 0
        narrow = cpu_hints(topo, available, reusable, request)
    finally:
        hints_module.EXACT_NODE_LIMIT = limit
    assert [h for h in exact if h in narrow] == narrow
    assert all(h in narrow for h in exact if h.preferred)
    if exact:
        narrowest = min(len(h.affinity) for h in exact)
        assert all(h in narrow for h in exact if len(h.affinity) == narrowest)
        assert exact[-1] in narrow
