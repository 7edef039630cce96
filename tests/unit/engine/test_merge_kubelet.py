"""The kubelet's merge cases (policy_test.go, policy_*_test.go, numa_info_test.go), table-driven.

Each case runs through the engine's merge and through the reference cross-product merge
(bench/baseline_merge.py), on the machine the kubelet's test uses: 4 nodes for best-effort and
restricted, the asymmetric 8-node table with prefer-closest-numa-nodes, 2 nodes for
single-numa-node. ``ALL`` stands for "every node of that machine".
"""

from __future__ import annotations

import pytest

from bench.baseline_merge import _HintMerger, baseline_merge, filter_providers_hints, max_of_min_affinity_counts
from nri_numa.engine import Hint, MergeError, merge_hints
from nri_numa.engine.bitmask import mask_of
from nri_numa.engine.numa_info import NumaInfo
from nri_numa.engine.policy import POLICY_NAMES, policy_by_name
from nri_numa.engine.policy.single_numa_node import filter_single_numa_hints

ALL = "all"
FOUR = (0, 1, 2, 3)
EIGHT = tuple(range(8))
DIST4 = ((10, 11, 12, 12), (11, 10, 12, 12), (12, 12, 10, 11), (12, 12, 11, 10))
DIST8 = (  # the kubelet's test table; row 7 has 13 towards 6, so it is not symmetric
    (10, 11, 12, 12, 30, 30, 30, 30), (11, 10, 12, 12, 30, 30, 30, 30),
    (12, 12, 10, 11, 30, 30, 30, 30), (12, 12, 11, 10, 30, 30, 30, 30),
    (30, 30, 30, 30, 10, 11, 12, 12), (30, 30, 30, 30, 11, 10, 12, 12),
    (30, 30, 30, 30, 12, 12, 10, 11), (30, 30, 30, 30, 12, 12, 13, 10),
)
CLOSEST = {"prefer-closest-numa-nodes": "true"}


def H(*ids: int, pref: bool = True) -> Hint:
    return Hint(frozenset(ids), pref)


def NIL(pref: bool) -> Hint:
    return Hint(None, pref)


def F(*ids: int) -> Hint:
    return H(*ids, pref=False)


# (name, providers, expected affinity (ids, ALL or None), expected preferred)
COMMON = [
    ("same mask, both preferred 1/2", [{"r1": [H(0)]}, {"r2": [H(0)]}], {0}, True),
    ("same mask, both preferred 2/2", [{"r1": [H(1)]}, {"r2": [H(1)]}], {1}, True),
    ("one provider without hints 1/2", [None, {"r": [H(0)]}], {0}, True),
    ("one provider without hints 2/2", [None, {"r": [H(1)]}], {1}, True),
    ("2 hints and 1 matching hint 1/2", [{"r1": [H(0), H(1)]}, {"r2": [H(0)]}], {0}, True),
    ("2 hints and 1 matching hint 2/2", [{"r1": [H(0), H(1)]}, {"r2": [H(1)]}], {1}, True),
    ("narrower preferred hint from both", [{"r1": [H(0), H(1)]}, {"r2": [H(0), F(0, 1)]}], {0}, True),
    ("wider preferred beats narrower non-preferred",
     [{"r1": [H(1), F(0, 1)]}, {"r2": [H(0), H(1), F(0, 1)]}], {1}, True),
    ("multiple resources, same provider", [{"r1": [H(1), F(0, 1)], "r2": [H(0), H(1), F(0, 1)]}], {1}, True),
]

BEST_EFFORT = [
    ("2 hints each, same masks", [{"r1": [H(0, 1), H(0, 2)]}, {"r2": [H(0, 1), H(0, 2)]}], {0, 1}, True),
    ("no providers", [], ALL, True),
    ("provider with an empty map", [{}], ALL, True),
    ("resource with no preference (nil list)", [{"r": None}], ALL, True),
    ("resource with an empty list", [{"r": []}], ALL, False),
    ("single nil hint, preferred", [{"r": [NIL(True)]}], ALL, True),
    ("single nil hint, not preferred", [{"r": [NIL(False)]}], ALL, False),
    ("no common mask", [{"r1": [H(0)]}, {"r2": [H(1)]}], ALL, False),
    ("same mask, one not preferred 1/2", [{"r1": [H(0)]}, {"r2": [F(0)]}], {0}, False),
    ("same mask, one not preferred 2/2", [{"r1": [H(1)]}, {"r2": [F(1)]}], {1}, False),
    ("wider mask, both preferred 1/2", [{"r1": [H(0)]}, {"r2": [H(0, 1)]}], {0}, False),
    ("2 hints and a non-preferred match", [{"r1": [H(0), H(1)]}, {"r2": [F(0, 1)]}], {0}, False),
    ("wider mask, both preferred 2/2", [{"r1": [H(1)]}, {"r2": [H(0, 1)]}], {1}, False),
    ("bestNonPreferredAffinityCount (1)", [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(0, 1)]}], {0, 1}, False),
    ("bestNonPreferredAffinityCount (2)", [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(0, 3)]}], {0, 3}, False),
    ("bestNonPreferredAffinityCount (3)", [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(1, 2)]}], {1, 2}, False),
    ("bestNonPreferredAffinityCount (4)", [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(2, 3)]}], {2, 3}, False),
]

BNPAC_5 = [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(1, 2), F(2, 3)]}]
BNPAC_6 = [{"r1": [F(0, 1, 2, 3), F(0, 1)]}, {"r2": [F(1, 2, 3), F(1, 2), F(1, 3), F(2, 3)]}]
NARROWEST_ONLY = [
    ("bestNonPreferredAffinityCount (5)", BNPAC_5, {1, 2}, False),
    ("bestNonPreferredAffinityCount (6)", BNPAC_6, {1, 2}, False),
]
CLOSEST_ONLY = [
    ("2 hints each, closest pair wins", [{"r1": [H(0, 4), H(0, 2)]}, {"r2": [H(0, 4), H(0, 2)]}], {0, 2}, True),
    ("2 hints each, different masks", [{"r1": [H(4), H(0, 2)]}, {"r2": [H(4), H(0, 2)]}], {4}, True),
    ("bestNonPreferredAffinityCount (5)", BNPAC_5, {2, 3}, False),
    ("bestNonPreferredAffinityCount (6)", BNPAC_6, {2, 3}, False),
    # Not upstream: {6,7} and {4,6} both average 11 only because row 7 says 13 towards 6; the tie
    # then goes to the smaller integer, {4,6}. Read symmetrically, {6,7} would win with 10.5.
    ("asymmetric distances are used as stored", [{"r1": [H(6, 7), H(4, 6)]}, {"r2": [H(6, 7), H(4, 6)]}],
     {4, 6}, True),
]
SINGLE_NUMA_NODE = [
    ("no providers", [], None, True),
    ("provider with an empty map", [{}], None, True),
    ("resource with no preference (nil list)", [{"r": None}], None, True),
    ("resource with an empty list", [{"r": []}], None, False),
    ("single nil hint, preferred", [{"r": [NIL(True)]}], None, True),
    ("single nil hint, not preferred", [{"r": [NIL(False)]}], None, False),
    ("no common mask", [{"r1": [H(0)]}, {"r2": [H(1)]}], None, False),
    ("same mask, one not preferred 1/2", [{"r1": [H(0)]}, {"r2": [F(0)]}], None, False),
    ("same mask, one not preferred 2/2", [{"r1": [H(1)]}, {"r2": [F(1)]}], None, False),
    ("2 hints and a non-preferred match", [{"r1": [H(0), H(1)]}, {"r2": [F(0, 1)]}], None, False),
    ("a 2-node preferred hint is dropped", [{"r1": [H(0, 1)], "r2": [H(0), H(1), F(0, 1)]}], None, False),
    ("one no-preference provider", [{"r1": [H(0), H(1), F(0, 1)]}, None], {0}, True),
]


def _expected(affinity, nodes) -> frozenset[int] | None:
    if affinity == ALL:
        return frozenset(nodes)
    return None if affinity is None else frozenset(affinity)


def _check(policy, nodes, providers, affinity, preferred, *, distances=None, options=None):
    expected_hint = Hint(_expected(affinity, nodes), preferred)
    admit = True if policy == "best-effort" else preferred
    for merge in (merge_hints, baseline_merge):
        got = merge(policy, nodes, providers, distances=distances, options=options)
        assert got == (expected_hint, admit), merge.__name__


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
@pytest.mark.parametrize("name, providers, affinity, preferred", COMMON + BEST_EFFORT + NARROWEST_ONLY,
                         ids=_ids(COMMON + BEST_EFFORT + NARROWEST_ONLY))
def test_best_effort_and_restricted(policy, name, providers, affinity, preferred):
    _check(policy, FOUR, providers, affinity, preferred)


@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
@pytest.mark.parametrize("name, providers, affinity, preferred", COMMON + BEST_EFFORT + CLOSEST_ONLY,
                         ids=_ids(COMMON + BEST_EFFORT + CLOSEST_ONLY))
def test_prefer_closest_numa_nodes_on_eight_nodes(policy, name, providers, affinity, preferred):
    _check(policy, EIGHT, providers, affinity, preferred, distances=DIST8, options=CLOSEST)


@pytest.mark.parametrize("name, providers, affinity, preferred", COMMON + SINGLE_NUMA_NODE,
                         ids=_ids(COMMON + SINGLE_NUMA_NODE))
def test_single_numa_node(name, providers, affinity, preferred):
    _check("single-numa-node", (0, 1), providers, affinity, preferred)


def test_single_numa_node_ignores_prefer_closest():
    # Node 2's own distance is 5, so closest would pick {2} (average 5) over {0} (average 10);
    # best-effort follows the option, single-numa-node merges by narrowest whatever it says.
    table = ((10, 11, 12, 12), (11, 10, 12, 12), (12, 12, 5, 11), (12, 12, 11, 10))
    providers = [{"r1": [H(2), H(0)]}, {"r2": [H(2), H(0)]}]
    _check("best-effort", FOUR, providers, {2}, True, distances=table, options=CLOSEST)
    _check("single-numa-node", FOUR, providers, {0}, True, distances=table, options=CLOSEST)


def test_single_numa_node_on_one_node_reports_no_affinity():
    _check("single-numa-node", (0,), [{"r": [H(0)]}], None, True)


@pytest.mark.parametrize("providers", [[], [{"r": []}], [{"r1": [H(0)]}, {"r2": [H(1)]}], [{"r": [F(0)]}]])
def test_none_policy_admits_everything_without_affinity(providers):
    for merge in (merge_hints, baseline_merge):
        assert merge("none", FOUR, providers) == (Hint(None, False), True)


def test_restricted_rejects_what_best_effort_admits():
    providers = [{"r1": [H(0)]}, {"r2": [H(1)]}]
    assert merge_hints("best-effort", FOUR, providers) == (Hint(frozenset(FOUR), False), True)
    assert merge_hints("restricted", FOUR, providers) == (Hint(frozenset(FOUR), False), False)


def test_resource_order_inside_a_provider_does_not_matter():
    forward = [{"r1": [F(0, 1, 2, 3), F(0, 1)], "r2": [F(1, 2), F(2, 3)]}]
    backward = [{"r2": [F(1, 2), F(2, 3)], "r1": [F(0, 1, 2, 3), F(0, 1)]}]
    assert merge_hints("best-effort", FOUR, forward) == merge_hints("best-effort", FOUR, backward)


def test_node_ids_past_63_and_sparse_ids():
    nodes = (0, 70, 130)
    providers = [{"r1": [H(70), H(0, 130, pref=False)]}, {"r2": [H(70, 130), H(130, pref=False)]}]
    # No preferred combination ({70} & {70,130} names different masks); the non-preferred merges
    # are {70} and {130}, both of the target size 1, and the smaller integer wins.
    _check("best-effort", nodes, providers, {70}, False)
    _check("restricted", nodes, [{"r": [H(130)]}, {"r": [H(130), H(70)]}], {130}, True)


def test_hints_naming_nodes_the_machine_lacks():
    # {5} is preferred by both resources but is not on the machine: the merge is empty and dies.
    _check("best-effort", (0, 1), [{"r1": [H(5), F(0, 1)]}, {"r2": [H(5)]}], ALL, False)
    # Preferred only if the masks as given are equal: {0,5} and {0} both give {0} on the machine,
    # yet the combination is not preferred.
    _check("best-effort", (0, 1), [{"r1": [H(0, 5)]}, {"r2": [H(0)]}], {0}, False)


def test_zero_numa_nodes():
    _check("best-effort", (), [], set(), False)
    _check("single-numa-node", (), [{"r": [H(0)]}], None, False)


# filterSingleNumaHints (policy_single_numa_node_test.go)
@pytest.mark.parametrize("slots, expected", [
    ([], []),
    ([(NIL(False),), (NIL(True),)], [(), (NIL(True),)]),
    ([(H(0), NIL(False)), (H(1), NIL(True))], [(H(0),), (H(1), NIL(True))]),
    ([(H(1), H(0), NIL(False)), ()], [(H(1), H(0)), ()]),
    ([(H(0), H(1), F(1, 2), F(0, 1, 2), NIL(False)), (F(1, 2), F(0, 1, 2), F(0, 2), F(3)),
      (F(1, 2), F(0, 1, 2), F(0, 2))],
     [(H(0), H(1)), (), ()]),
], ids=["empty", "nil masks 1/2", "nil masks 2/2", "empty resource", "wide masks"])
def test_filter_single_numa_hints(slots, expected):
    assert filter_single_numa_hints(slots) == expected


# maxOfMinAffinityCounts (policy_test.go), on the reference merge
@pytest.mark.parametrize("slots, expected", [
    ([], 0),
    ([[H()]], 0),
    ([[H(0)]], 1),
    ([[H(0, 1)]], 2),
    ([[H(0, 1), H(0, 1, 2)]], 2),
    ([[H(0, 1), H(0, 1, 2)], [H(0, 1, 2)]], 3),
    ([[H(0, 1), H(0, 1, 2)], [H(0, 1, 2), H(0, 1, 2, 3)]], 3),
])
def test_max_of_min_affinity_counts(slots, expected):
    raw = [[(mask_of(h.affinity), h.preferred) for h in slot] for slot in slots]
    assert max_of_min_affinity_counts(raw) == expected


# HintMerger.compare (TestCompareHintsNarrowest), on the reference merge: "current" or "candidate"
E = frozenset()
COMPARE = [
    ("candidate empty (1)", -1, None, (E, False), "current"),
    ("candidate empty (2)", -1, (E, True), (E, False), "current"),
    ("no current (1)", -1, None, ({0}, True), "candidate"),
    ("no current (2)", -1, None, ({0}, False), "candidate"),
    ("preferred candidate wins", -1, ({0}, False), ({0}, True), "candidate"),
    ("preferred current stays", -1, ({0}, True), ({0}, False), "current"),
    ("both preferred (1)", -1, ({0}, True), ({0}, True), "current"),
    ("both preferred (2)", -1, ({0, 1}, True), ({0}, True), "candidate"),
    ("both preferred (3)", -1, ({0}, True), ({0, 1}, True), "current"),
    ("1.1", 1, ({0, 1}, False), ({0, 1}, False), "current"),
    ("1.2", 1, ({1, 2}, False), ({0, 1}, False), "candidate"),
    ("1.3", 1, ({0, 1}, False), ({1, 2}, False), "current"),
    ("2.1", 2, ({0, 1}, False), ({0}, False), "current"),
    ("2.2", 2, ({0, 1}, False), ({0, 1}, False), "current"),
    ("2.3", 2, ({1, 2}, False), ({0, 1}, False), "candidate"),
    ("2.4", 2, ({0, 1}, False), ({1, 2}, False), "current"),
    ("3a", 2, ({0}, False), ({0, 1, 2}, False), "current"),
    ("3b", 2, ({0}, False), ({0, 1}, False), "candidate"),
    ("3ca.1", 3, ({0}, False), ({0, 1}, False), "candidate"),
    ("3ca.2", 3, ({0}, False), ({1, 2}, False), "candidate"),
    ("3ca.3", 4, ({0, 1}, False), ({1, 2, 3}, False), "candidate"),
    ("3cb", 4, ({1, 2, 3}, False), ({0, 1}, False), "current"),
    ("3cc.1", 4, ({0, 1, 2}, False), ({0, 1, 2}, False), "current"),
    ("3cc.2", 4, ({0, 1, 2}, False), ({1, 2, 3}, False), "current"),
    ("3cc.3", 4, ({1, 2, 3}, False), ({0, 1, 2}, False), "candidate"),
]


@pytest.mark.parametrize("name, target, current, candidate, winner", COMPARE, ids=[c[0] for c in COMPARE])
def test_reference_compare(name, target, current, candidate, winner):
    merger = _HintMerger([0, 1, 2, 3], None, [])
    merger.best_non_preferred_affinity_count = target
    raw_current = None if current is None else (mask_of(current[0]), current[1])
    raw_candidate = (mask_of(candidate[0]), candidate[1])
    result = merger.compare(raw_current, raw_candidate)
    assert result is (raw_current if winner == "current" else raw_candidate)


def test_reference_filter_providers_hints():
    slots = filter_providers_hints([None, {}, {"a": None, "b": [], "c": [H(1), NIL(False)]}])
    assert slots == [[(None, True)], [(None, True)], [(None, True)], [(None, False)], [(2, True), (None, False)]]


# NUMAInfo (numa_info_test.go)
@pytest.mark.parametrize("nodes, table, mask, average", [
    ((0,), ((10,),), {0}, 10.0),
    ((0, 1), ((10, 11), (11, 10)), {0}, 10.0),
    ((0, 1), ((10, 11), (11, 10)), {0, 1}, 10.5),
    (FOUR, DIST4, {0, 2}, 11.0),
    (FOUR, DIST4, {0, 2, 3}, 11.11111111111111),
    ((), (), set(), 0.0),
])
def test_average_distance(nodes, table, mask, average):
    assert NumaInfo(nodes, table).average_distance(mask_of(mask)) == average


SAME = ((10,) * 4,) * 4
CLOSEST_CASES = [
    ("different counts: narrower", FOUR, DIST4, {0}, {0, 2}, "current"),
    ("same distance, current has the smaller integer", FOUR, SAME, {0, 1}, {0, 2}, "current"),
    ("same distance, candidate has the smaller integer", FOUR, SAME, {0, 3}, {0, 2}, "candidate"),
    ("candidate closer", FOUR, DIST4, {0, 3}, {0, 1}, "candidate"),
    ("current closer", FOUR, DIST4, {2, 3}, {0, 3}, "current"),
]


@pytest.mark.parametrize("name, nodes, table, current, candidate, winner", CLOSEST_CASES,
                         ids=[c[0] for c in CLOSEST_CASES])
def test_closest(name, nodes, table, current, candidate, winner):
    info = NumaInfo(nodes, table)
    expected = mask_of(current if winner == "current" else candidate)
    assert info.closest(mask_of(candidate), mask_of(current)) == expected
    assert info.closest(mask_of(current), mask_of(candidate)) == expected


def test_narrowest():
    info = NumaInfo(FOUR)
    assert info.narrowest(mask_of({1, 2}), mask_of({0, 3})) == mask_of({1, 2})
    assert info.narrowest(mask_of({0, 1, 2}), mask_of({3})) == mask_of({3})


def test_policy_registry():
    assert sorted(POLICY_NAMES) == ["best-effort", "none", "restricted", "single-numa-node"]
    assert all(policy_by_name(name).name == name for name in POLICY_NAMES)


@pytest.mark.parametrize("call, message", [
    (lambda: merge_hints("static", FOUR, []), 'unknown policy: "static"'),
    (lambda: merge_hints("best-effort", range(9), []), "unsupported on machines with more than 8 NUMA Nodes"),
    (lambda: merge_hints("best-effort", range(13), [], options={"max-allowable-numa-nodes": "12"}),
     "unsupported on machines with more than 12 NUMA Nodes"),
    (lambda: merge_hints("best-effort", FOUR, [], options=CLOSEST), "no NUMA distances were given"),
    (lambda: merge_hints("best-effort", (0, 1, 1), []), "duplicate NUMA node ids"),
    (lambda: merge_hints("best-effort", (0, -1), []), "non-negative integer, got -1"),
    (lambda: merge_hints("best-effort", "01", []), "numa_nodes: expected a list"),
    (lambda: merge_hints("best-effort", FOUR, [], distances=DIST4[:3], options=CLOSEST), "expected 4 rows"),
    (lambda: merge_hints("best-effort", FOUR, [], distances=(DIST4[0],) * 3 + ((10, 11),), options=CLOSEST),
     r"distances\[3\]: expected 4 values"),
    (lambda: merge_hints("best-effort", FOUR, [], distances=DIST4[:3] + ((10, 11, 12, "x"),), options=CLOSEST),
     r"distances\[3\]\[3\]: expected a non-negative integer"),
    (lambda: merge_hints("best-effort", FOUR, {"r": [H(0)]}), "expected a list with one entry per provider"),
    (lambda: merge_hints("best-effort", FOUR, [[H(0)]]), r"providers_hints\[0\]: expected a mapping"),
    (lambda: merge_hints("best-effort", FOUR, [{"r": H(0)}]), r"providers_hints\[0\]\['r'\]: expected a list"),
    (lambda: merge_hints("best-effort", FOUR, [{"r": [H(0), {0}]}]),
     r"providers_hints\[0\]\['r'\]\[1\]: expected a Hint"),
    (lambda: Hint({0, -2}, True), "Hint.affinity: NUMA node id must be a non-negative integer"),
    (lambda: Hint({0}, 1), "Hint.preferred must be a bool"),
    (lambda: Hint("01", True), "Hint.affinity must be NUMA node ids or None"),
])
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(MergeError, match=message):
        call()


def test_node_limit_does_not_apply_to_policy_none():
    assert merge_hints("none", range(64), []) == (Hint(None, False), True)


def test_more_than_eight_nodes_when_the_option_allows():
    nodes = tuple(range(64))
    providers = [{"cpu": [H(40), H(41), F(40, 41)]}, {"gpu": [H(41), F(40, 41, 42)]}]
    got = merge_hints("restricted", nodes, providers, options={"max-allowable-numa-nodes": "64"})
    assert got == (H(41), True)


def test_hint_semantics():
    assert H(0, 1) == Hint([1, 0], True) and hash(H(0, 1)) == hash(Hint([1, 0], True))
    assert NIL(True) != Hint(frozenset(), True)  # nil is not the empty mask
    assert H(0) != F(0)
    assert H(0, 1).mask == 0b11 and NIL(False).mask is None


@pytest.mark.parametrize("providers", [None, [], [{"r": [H(0)]}], [{"r1": [H(0)]}, {"r2": [H(1)]}]])
def test_none_policy_accepts_an_absent_node_list(providers):
    # policy_none_test.go builds the none policy without any NUMA info and passes nil hints.
    assert merge_hints("none", None, providers) == (Hint(None, False), True)


def test_an_absent_node_list_is_refused_by_the_aligning_policies():
    for policy in ("best-effort", "restricted", "single-numa-node"):
        with pytest.raises(MergeError, match="numa_nodes: expected a list"):
            merge_hints(policy, None, [])
