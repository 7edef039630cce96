"""Bounded hint lists for machines past 8 NUMA nodes (nri_numa/engine/bounded_hints.py).

Up to MAX_ENUMERATED masks of the minimal width k, the preferred hints must be exactly what the
kubelet's full enumeration would mark preferred: every k-node mask that fits what is free (and
the caller's rules). That is checked against a brute force on small machines; the wider
fallbacks (nearest nodes grown from every seed, the whole machine) are checked for their
definition and their bound.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.bounded_hints import EXACT_NODE_LIMIT, MAX_ENUMERATED, Demand, bounded_hints
from nri_numa.engine.hints import Hint


def ring(n: int) -> dict[int, dict[int, int]]:
    """Distances on a ring: 10 to itself, 10 + 2 × hops otherwise."""
    return {i: {j: 10 + 2 * min((i - j) % n, (j - i) % n) for j in range(n)} for i in range(n)}


def uniform(n: int, request: int, capacity: int, free: int | None = None) -> Demand:
    return Demand(request, {i: capacity for i in range(n)},
                  {i: capacity if free is None else free for i in range(n)})


def brute_min_width(nodes, demands) -> int | None:
    for k in range(1, len(nodes) + 1):
        if any(all(d.fits_capacity(g) for d in demands) for g in combinations(nodes, k)):
            return k
    return None


def mask_key(h: Hint) -> tuple[int, int]:
    return len(h.affinity), sum(1 << n for n in h.affinity)


def test_the_exact_limit_is_the_kubelets():
    assert EXACT_NODE_LIMIT == 8


def test_one_node_each_when_any_node_holds_the_request():
    hints = bounded_hints(range(12), [uniform(12, 4, 8)], ring(12))
    singles = [h for h in hints if h.preferred]
    assert singles == [Hint({i}, True) for i in range(12)]
    # Nothing wider is needed for the fallback: each seed alone covers the request, and the
    # whole machine comes last, not preferred.
    assert hints[-1] == Hint(set(range(12)), False) and len(hints) == 13


def test_nothing_when_even_the_whole_machine_is_too_small():
    assert bounded_hints(range(10), [uniform(10, 81, 8)], ring(10)) == []


def test_nothing_when_the_request_fits_the_machine_but_nothing_is_free():
    assert bounded_hints(range(10), [uniform(10, 4, 8, free=0)], ring(10)) == []


def test_minimal_width_counts_capacity_not_what_is_free():
    # Two nodes of capacity would do, but only three nodes have enough free between them:
    # no mask of width 2 is usable, so no hint is preferred.
    free = {0: 4, 1: 4, 2: 4, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0}
    demand = Demand(10, {i: 8 for i in range(10)}, free)
    hints = bounded_hints(range(10), [demand], ring(10))
    assert hints and not any(h.preferred for h in hints)
    assert Hint({0, 1, 2}, False) in hints


def test_required_nodes_are_in_every_mask():
    hints = bounded_hints(range(12), [uniform(12, 4, 8)], ring(12), required=frozenset({5}))
    assert hints and all(5 in h.affinity for h in hints)
    assert [h for h in hints if h.preferred] == [Hint({5}, True)]


def test_the_caller_can_forbid_masks():
    hints = bounded_hints(range(12), [uniform(12, 12, 8)], ring(12),
                          allow=lambda group: 0 not in group)
    assert hints and all(0 not in h.affinity for h in hints)
    assert Hint({1, 2}, True) in hints and Hint({0, 1}, True) not in hints


def test_every_pair_is_listed_on_64_nodes():
    hints = bounded_hints(range(64), [uniform(64, 12, 8)], ring(64))
    preferred = [h for h in hints if h.preferred]
    assert len(preferred) == 64 * 63 // 2 <= MAX_ENUMERATED
    assert {frozenset(g) for g in combinations(range(64), 2)} == {h.affinity for h in preferred}


def test_past_the_enumeration_cap_each_node_grows_its_nearest_group():
    n = 64
    distances = ring(n)
    hints = bounded_hints(range(n), [uniform(n, 20, 8)], distances)  # width 3: C(64,3) > cap
    preferred = [h for h in hints if h.preferred]
    # On a ring each seed's nearest two are its neighbours (ties by id): groups of 3 in a row.
    expected = {frozenset({(s - 1) % n, s, (s + 1) % n}) for s in range(n)}
    assert {h.affinity for h in preferred} == expected
    assert len(hints) <= 2 * n + 1


def test_the_list_is_in_kubelet_order_and_the_same_every_time():
    demands = [uniform(16, 20, 8), Demand(3, {i: 2 for i in range(16)}, {i: 1 for i in range(16)})]
    first = bounded_hints(range(16), demands, ring(16))
    assert first == sorted(first, key=mask_key)
    assert bounded_hints(list(reversed(range(16))), demands, ring(16)) == first
    assert len({h.affinity for h in first}) == len(first)


@st.composite
def machines(draw):
    n = draw(st.integers(1, 10))
    demands = []
    for _ in range(draw(st.integers(1, 2))):
        capacity = {i: draw(st.integers(0, 8)) for i in range(n)}
        free = {i: draw(st.integers(0, capacity[i])) for i in range(n)}
        demands.append(Demand(draw(st.integers(1, 24)), capacity, free))
    required = frozenset(draw(st.sets(st.integers(0, n - 1), max_size=2)))
    forbidden = draw(st.sets(st.integers(0, n - 1), max_size=2))
    return n, demands, required, forbidden


@settings(max_examples=150, deadline=None)
@given(machines())
def test_preferred_hints_are_exactly_the_kubelets_on_small_machines(machine):
    n, demands, required, forbidden = machine
    nodes = tuple(range(n))
    allow = lambda group: not forbidden & set(group)  # noqa: E731

    def usable(group) -> bool:
        return (required <= set(group) and all(d.fits_free(group) for d in demands)
                and allow(group))

    hints = bounded_hints(nodes, demands, ring(n), required=required, allow=allow)
    k = brute_min_width(nodes, demands)
    if k is None:
        assert hints == []
        return
    preferred = {h.affinity for h in hints if h.preferred}
    assert preferred == {frozenset(g) for g in combinations(nodes, k) if usable(g)}
    assert all(usable(tuple(h.affinity)) for h in hints)
    assert all(h.preferred == (len(h.affinity) == k) for h in hints)
    assert hints == sorted(hints, key=mask_key)
    if usable(nodes):
        assert Hint(set(nodes), n == k) in hints
