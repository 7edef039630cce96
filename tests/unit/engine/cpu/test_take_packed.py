"""take_cpus, packed and spread: the kubelet's cases (cpu_assignment_test.go, policy_static_test.go)
plus properties.

Unless a comment says otherwise, every expectation below is the upstream test's own.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.cpu import NotEnoughCPUsError, take_cpus
from nri_numa.engine.cpu.accumulator import CPUAccumulator
from nri_numa.engine.cpu.topology import mask_of

from .kubelet_fixtures import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_HT_ONE_UNCORE,
    DUAL_SOCKET_MULTI_NUMA_HT,
    DUAL_SOCKET_MULTI_NUMA_UNCORE,
    DUAL_SOCKET_NO_HT,
    DUAL_SOCKET_SUB_NUMA_HT_MONOLITHIC_UNCORE,
    LARGE_SINGLE_SOCKET_SMT_UNCORE,
    LARGE_SINGLE_SOCKET_UNCORE,
    MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    QUAD_SOCKET_0_FROM_COMMENT,
    QUAD_SOCKET_FOUR_WAY_HT,
    SINGLE_SOCKET_HT,
    SINGLE_SOCKET_MONOLITHIC_UNCORE,
    SINGLE_SOCKET_NO_SMT_SMALL_UNCORE,
    SINGLE_SOCKET_SMT_SMALL_UNCORE,
    SMALL_DUAL_SOCKET_NO_SMT_UNCORE,
    SMALL_SINGLE_SOCKET_NO_SMT_UNCORE,
    TRIPLE_SOCKET_HT,
    UNCORE_DUAL_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_MULTI_NUMA,
    UNCORE_SINGLE_SOCKET_NO_SMT,
    UNCORE_SINGLE_SOCKET_SMT,
    cpus,
)


def accumulator(topo, available) -> CPUAccumulator:
    return CPUAccumulator(topo, mask_of(available), 0)


# --- orderings (TestCPUAccumulatorFree*) ------------------------------------------------------

@pytest.mark.parametrize("topo, available, expected", [
    (SINGLE_SOCKET_HT, "0-7", [0]),
    (SINGLE_SOCKET_HT, "1-7", []),
    (DUAL_SOCKET_HT, "0-11", [0, 1]),
    (DUAL_SOCKET_HT, "0-9,11", [1]),
    (DUAL_SOCKET_HT, "0,2-9,11", []),
    (DUAL_SOCKET_MULTI_NUMA_HT, "0-79", [0, 1]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-79", [1]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-78", []),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-79", [0, 1, 2, 3]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-19,21-79", [0, 1, 3]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-59,61-78", [0, 1]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "1-19,21-38,41-60,61-78", [1]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-40,42-49,51-68,71-79", []),
])
def test_free_sockets(topo, available, expected):
    # upstream sorts this one before comparing
    assert sorted(accumulator(topo, cpus(available)).free_sockets()) == expected


@pytest.mark.parametrize("topo, available, expected", [
    (SINGLE_SOCKET_HT, "0-7", [0]),
    (SINGLE_SOCKET_HT, "1-7", []),
    (DUAL_SOCKET_HT, "0-11", [0, 1]),
    (DUAL_SOCKET_HT, "0-9,11", [1]),
    (DUAL_SOCKET_HT, "0,2-9,11", []),
    (DUAL_SOCKET_MULTI_NUMA_HT, "0-79", [0, 1, 2, 3]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-79", [1, 2, 3]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-79", [2, 3]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-59,61-79", [3]),
    (DUAL_SOCKET_MULTI_NUMA_HT, "1-9,11-59,61-78", []),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-79", [0, 1]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-9,11-79", [1]),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, "0-9,11-59,61-79", []),
])
def test_free_numa_nodes(topo, available, expected):
    assert accumulator(topo, cpus(available)).free_numa_nodes() == expected


@pytest.mark.parametrize("available, sockets, numas", [
    ("0-79", [0, 1], [0, 1, 2, 3]),
    ("1-79", [1], [1, 2, 3]),
    ("1-9,11-79", [1], [2, 3]),
    ("1-59,61-79", [], [1, 3]),
])
def test_free_sockets_and_numa_nodes(available, sockets, numas):
    acc = accumulator(DUAL_SOCKET_MULTI_NUMA_HT, cpus(available))
    assert (acc.free_sockets(), acc.free_numa_nodes()) == (sockets, numas)


@pytest.mark.parametrize("topo, available, expected", [
    (SINGLE_SOCKET_HT, "0-7", [0, 1, 2, 3]),
    (SINGLE_SOCKET_HT, "0-2,4-6", [0, 1, 2]),
    (SINGLE_SOCKET_HT, "0-6", [0, 1, 2]),
    (SINGLE_SOCKET_HT, "", []),
    (SINGLE_SOCKET_HT, "0-3", []),
    (DUAL_SOCKET_HT, "0-11", [0, 2, 4, 1, 3, 5]),
    (DUAL_SOCKET_HT, "1-5,7-11", [2, 4, 1, 3, 5]),
    (DUAL_SOCKET_HT, "2-5,8-11", [2, 4, 3, 5]),
])
def test_free_cores(topo, available, expected):
    assert accumulator(topo, cpus(available)).free_cores() == expected


@pytest.mark.parametrize("topo, available, expected", [
    (SINGLE_SOCKET_HT, "0-7", [0, 4, 1, 5, 2, 6, 3, 7]),
    (SINGLE_SOCKET_HT, "3-7", [4, 5, 6, 3, 7]),
    (DUAL_SOCKET_HT, "0-11", [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    (DUAL_SOCKET_HT, "1-11", [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    (DUAL_SOCKET_HT, "1-5,7-11", [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    (TRIPLE_SOCKET_HT, "0-3,6-13", [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
])
def test_packed_cpu_order(topo, available, expected):
    assert accumulator(topo, cpus(available)).packed_cpu_order() == expected


# --- packed (commonTakeByTopologyTestCases + TestTakeByTopologyNUMAPacked) -------------------

COMMON_CASES = [
    ("one cpu, single socket HT", SINGLE_SOCKET_HT, "0-7", 1, "0"),
    ("one cpu, some taken", SINGLE_SOCKET_HT, "1,3,5-7", 1, "6"),
    ("two cpus, single socket HT", SINGLE_SOCKET_HT, "0-7", 2, "0,4"),
    ("all cpus, single socket HT", SINGLE_SOCKET_HT, "0-7", 8, "0-7"),
    ("two cpus, one core wholly free", SINGLE_SOCKET_HT, "0-3,6", 2, "2,6"),
    ("a socket, dual socket HT", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("a socket, multi NUMA per socket", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 40, "0-19,40-59"),
    ("a NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 20, "0-9,40-49"),
    ("a NUMA node, one taken", DUAL_SOCKET_MULTI_NUMA_HT, "10-39,50-79", 20, "10-19,50-59"),
    ("a socket and a NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 60, "0-29,40-69"),
    ("a socket and a NUMA node, a core taken", DUAL_SOCKET_MULTI_NUMA_HT, "1-39,41-79", 60,
     "10-39,50-79"),
]

PACKED_CASES = COMMON_CASES + [
    ("one cpu, core from socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, "2"),
    ("4 cores: 3 fill NUMA 0, 1 from NUMA 1", DUAL_SOCKET_HT, "0-11", 8, "0,6,2,8,4,10,1,7"),
    ("32 cores: 3 NUMA nodes filled, 2 cores from the 4th", DUAL_SOCKET_MULTI_NUMA_HT, "0-79",
     64, "0-29,40-69,30,31,70,71"),
]


@pytest.mark.parametrize("name, topo, available, count, expected", PACKED_CASES,
                         ids=[c[0] for c in PACKED_CASES])
def test_packed(name, topo, available, count, expected):
    assert take_cpus(topo, cpus(available), count) == cpus(expected)


def test_zero_cpus_is_empty():
    assert take_cpus(SINGLE_SOCKET_HT, cpus("0-7"), 0) == frozenset()


@pytest.mark.parametrize("options", [{}, {"spread_across_cores": True},
                                     {"align_by_uncore_cache": True},
                                     {"distribute_across_numa": True}])
def test_more_than_available_is_refused_with_kubelet_text(options):
    with pytest.raises(NotEnoughCPUsError) as err:
        take_cpus(SINGLE_SOCKET_HT, cpus("0,2,4,6"), 5, **options)
    assert str(err.value) == \
        "not enough cpus available to satisfy request: requested=5, available=4"


# --- spread (TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption) -------------------------

SPREAD_CASES = [
    (SINGLE_SOCKET_HT, "0-7", 3, "0-2"),
    (DUAL_SOCKET_HT, "0-11", 2, "0,2"),
    (DUAL_SOCKET_HT, "0-11", 3, "0,2,4"),
    (DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    (DUAL_SOCKET_HT, "0-11", 8, "0,2,4,6,8,10,1,3"),
    (DUAL_SOCKET_NO_HT, "0-7", 2, "0,1"),
    (DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 8, "0-7"),
    (QUAD_SOCKET_FOUR_WAY_HT, "0-287", 12, "0-2,9-10,13-14,21-22,25-26,33"),
]


@pytest.mark.parametrize("topo, available, count, expected", SPREAD_CASES)
def test_spread_across_cores(topo, available, count, expected):
    assert take_cpus(topo, cpus(available), count, spread_across_cores=True) == cpus(expected)


def test_quad_socket_transcription_matches_the_fixture_comment():
    assert QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets([0]) == QUAD_SOCKET_0_FROM_COMMENT
    assert QUAD_SOCKET_FOUR_WAY_HT.cpu_ids() == frozenset(range(288))


# --- prefer-align-cpus-by-uncorecache ---------------------------------------------------------

UNCORE_CASES = [
    ("two full uncore caches and part of one", UNCORE_SINGLE_SOCKET_NO_SMT, "1-15", 10,
     "1,2,4-11"),
    # Every CPU's uncore id is 0 in the upstream fixture: the partial take from that one cache
    # picks the lowest-numbered core with a free CPU (core 1) and drops its upper thread.
    ("one cpu, dual socket HT", DUAL_SOCKET_HT_ONE_UNCORE, "1-5,7-11", 1, "1"),
    ("first uncore cache of the first socket", UNCORE_DUAL_SOCKET_NO_SMT, "0-15", 4, "0-3"),
    ("all free of the first socket", UNCORE_DUAL_SOCKET_NO_SMT, "2-15", 6, "2-7"),
    ("first uncore cache of the second socket", UNCORE_DUAL_SOCKET_NO_SMT, "8-15", 4, "8-11"),
    ("first fitting cache of the NUMA order", UNCORE_SINGLE_SOCKET_MULTI_NUMA, "3-8,12", 2, "4,5"),
    ("best uncore cache, SMT", UNCORE_SINGLE_SOCKET_SMT, "2-7,10-15", 6, "4-6,12-14"),
    ("several uncore caches, SMT", UNCORE_SINGLE_SOCKET_SMT, "1-7,9-15", 10, "4-7,12-15,1,9"),
]


@pytest.mark.parametrize("name, topo, available, count, expected", UNCORE_CASES,
                         ids=[c[0] for c in UNCORE_CASES])
def test_align_by_uncore_cache(name, topo, available, count, expected):
    assert take_cpus(topo, cpus(available), count, align_by_uncore_cache=True) == cpus(expected)


def _uncores(topo, chosen):
    return {u for u, mask in topo.uncore_cpus.items() if mask & mask_of(chosen)}


# TestStaticPolicyAddWithUncore, on the RECONSTRUCTED fixtures: (available = default set minus
# reserved, requests of the containers in order, uncore caches the pod ends up in). Each
# container's CPUs leave the free set before the next one is placed, as Allocate does.
STATIC_POLICY_UNCORE_CASES = [
    ("saturating container, uncore 1 busy", SINGLE_SOCKET_SMT_SMALL_UNCORE,
     cpus("0-127") - cpus("0,1,64,65") - cpus("4-7,68-71"), [12], {0, 2}),
    ("three uncores' worth, fragmented", SINGLE_SOCKET_NO_SMT_SMALL_UNCORE,
     cpus("4-63") - cpus("8-15,20-23"), [12], {1, 4, 6}),
    ("two containers fit one uncore", SMALL_DUAL_SOCKET_NO_SMT_UNCORE,
     cpus("2-31,34-63") - cpus("8-15"), [4, 2], {0}),
    ("two containers need two uncores", SMALL_DUAL_SOCKET_NO_SMT_UNCORE,
     cpus("2-31,34-63") - cpus("8-15"), [4, 4], {0, 2}),
    ("partial uncores fit", LARGE_SINGLE_SOCKET_SMT_UNCORE,
     cpus("0-255") - cpus("0,1,128,129,8,9,136,137"), [12, 12], {0, 1}),
    ("partial uncores do not fit", LARGE_SINGLE_SOCKET_SMT_UNCORE,
     cpus("0-255") - cpus("0,1,128,129,8,9,136,137"), [14, 14], {2, 3}),
    ("a NUMA node's worth", DUAL_SOCKET_MULTI_NUMA_UNCORE, cpus("4-191"), [48],
     {6, 7, 8, 9, 10, 11}),
    ("ARM, one uncore's worth", LARGE_SINGLE_SOCKET_UNCORE, cpus("4-127"), [8], {1}),
    ("every uncore partly used", SMALL_SINGLE_SOCKET_NO_SMT_UNCORE,
     cpus("4-31") - cpus("8-11,16-19,24-27"), [8], {0, 1}),
]


@pytest.mark.parametrize("name, topo, available, requests, expected",
                         STATIC_POLICY_UNCORE_CASES, ids=[c[0] for c in STATIC_POLICY_UNCORE_CASES])
def test_static_policy_uncore_cases(name, topo, available, requests, expected):
    free = set(available)
    taken = set()
    for count in requests:
        chosen = take_cpus(topo, free, count, align_by_uncore_cache=True)
        assert len(chosen) == count
        free -= chosen
        taken |= chosen
    assert _uncores(topo, taken) == expected


@pytest.mark.parametrize("topo, available, count, expected", [
    # monolithic uncore cache (the socket stands in): same as plain packed
    (DUAL_SOCKET_SUB_NUMA_HT_MONOLITHIC_UNCORE, cpus("0-239") - cpus("0,1,120,121"), 6,
     "2-4,122-124"),
    (SINGLE_SOCKET_MONOLITHIC_UNCORE, cpus("2-63") - cpus("6-9,12-15,18,19"), 12,
     "2-5,10,11,16,17,20-23"),
])
def test_static_policy_monolithic_uncore_cases(topo, available, count, expected):
    chosen = take_cpus(topo, available, count, align_by_uncore_cache=True)
    assert chosen == cpus(expected)
    assert chosen == take_cpus(topo, available, count)


# --- option checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"distribute_across_numa": True, "spread_across_cores": True},
     "static policy options distribute-cpus-across-numa and distribute-cpus-across-cores can not"
     " be used at the same time"),
    ({"align_by_uncore_cache": True, "spread_across_cores": True},
     "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-cores"
     " can not be used at the same time"),
    ({"align_by_uncore_cache": True, "distribute_across_numa": True},
     "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa"
     " can not be used at the same time"),
    ({"cpu_group_size": 0}, "cpu_group_size must be a positive integer, not 0"),
])
def test_refused_options(options, message):
    with pytest.raises(ValueError) as err:
        take_cpus(SINGLE_SOCKET_HT, cpus("0-7"), 2, **options)
    assert str(err.value) == message


@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_bad_count(count):
    with pytest.raises(ValueError, match="CPU count must be a non-negative integer"):
        take_cpus(SINGLE_SOCKET_HT, cpus("0-7"), count)


@pytest.mark.parametrize("bad", [-1, "3", None, 2.0])
def test_bad_cpu_ids(bad):
    with pytest.raises(ValueError, match="available must hold CPU ids"):
        take_cpus(SINGLE_SOCKET_HT, [0, 1, bad], 1)


def test_cpus_outside_the_topology_are_ignored():
    assert take_cpus(SINGLE_SOCKET_HT, {1, 5, 99}, 2) == {1, 5}
    with pytest.raises(NotEnoughCPUsError):
        take_cpus(SINGLE_SOCKET_HT, {1, 99}, 2)


# --- properties -------------------------------------------------------------------------------

TOPOLOGIES = [SINGLE_SOCKET_HT, DUAL_SOCKET_HT, DUAL_SOCKET_MULTI_NUMA_HT,
              MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, TRIPLE_SOCKET_HT, UNCORE_SINGLE_SOCKET_SMT,
              UNCORE_SINGLE_SOCKET_MULTI_NUMA]
OPTIONS = [{}, {"spread_across_cores": True}, {"align_by_uncore_cache": True}]


@st.composite
def requests(draw):
    topo = draw(st.sampled_from(TOPOLOGIES))
    available = draw(st.sets(st.sampled_from(sorted(topo.cpu_ids()))))
    count = draw(st.integers(0, len(available)))
    return topo, frozenset(available), count, draw(st.sampled_from(OPTIONS))


@settings(max_examples=150, deadline=None)
@given(requests())
def test_result_is_a_deterministic_subset_of_the_requested_size(case):
    topo, available, count, options = case
    chosen = take_cpus(topo, available, count, **options)
    assert chosen <= available
    assert len(chosen) == count
    assert take_cpus(topo, set(reversed(sorted(available))), count, **options) == chosen


@st.composite
def whole_core_requests(draw):
    topo = draw(st.sampled_from([t for t in TOPOLOGIES if t.cpus_per_core > 1]))
    free_cores = draw(st.sets(st.sampled_from(sorted(topo.core_cpus)), min_size=1))
    loose = draw(st.sets(st.sampled_from(sorted(topo.cpu_ids()))))
    available = frozenset(loose).union(*(topo.cpus_in_cores([c]) for c in free_cores))
    cores_wanted = draw(st.integers(1, len(free_cores)))
    return topo, available, cores_wanted * topo.cpus_per_core


@settings(max_examples=150, deadline=None)
@given(whole_core_requests())
def test_packed_takes_whole_cores_when_it_can(case):
    """A request of whole cores, with at least that many wholly free cores, gets whole cores."""
    topo, available, count = case
    chosen = take_cpus(topo, available, count)
    assert topo.siblings(chosen) == chosen
