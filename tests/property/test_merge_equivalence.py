"""The engine's merge gives exactly the cross product's answer (bench/baseline_merge.py).

Random cases: 0..16 NUMA nodes (mostly 1..8; ids sometimes sparse, past 63, or out of order),
0..5 providers that are None, {} or resource maps whose lists are None, [], or hints with node
sets, nil affinities, empty sets and nodes the machine lacks; every policy; prefer-closest on and
off with random, often asymmetric, distance tables whose small value range makes ties common.
Lists are sized so the cross product stays small enough for the baseline to walk.

1,200 cases come from a seeded generator, 400 from hypothesis; 80 more use few resources with
long lists, so that the merge's transform join (not only the pairwise one) is checked.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.baseline_merge import baseline_merge
from nri_numa.engine import Hint, merge_hints
from nri_numa.engine import bitmask

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
MAX_COMBINATIONS = 2000


def random_case(rng: random.Random) -> dict:
    count = rng.choice((1, 1, 2, 2, 3, 4, 4, 5, 6, 7, 8, 8)) if rng.random() < 0.9 else rng.choice((0, 9, 12, 16))
    nodes = _node_ids(rng, count)
    foreign = [max(nodes, default=0) + 1 + rng.randrange(3)] if rng.random() < 0.15 else []
    providers, budget = [], MAX_COMBINATIONS
    for _ in range(rng.randint(0, 5)):
        provider, budget = _random_provider(rng, nodes + foreign, budget)
        providers.append(provider)
    return _finish(rng, nodes, providers)


def wide_case(rng: random.Random) -> dict:
    """Two or three resources with long lists of mostly non-preferred hints, on 5 to 8 nodes
    (with fewer, there are too few distinct masks for a transform join to pay)."""
    nodes = list(range(rng.randint(5, 8)))
    budget, providers = MAX_COMBINATIONS * 4, []
    for _ in range(rng.randint(2, 3)):
        size = max(1, min(rng.randint(30, 120), budget))
        budget //= size
        hints = [Hint(None if rng.random() < 0.05 else frozenset(n for n in nodes if rng.random() < 0.6),
                      rng.random() < 0.03) for _ in range(size)]
        providers.append({"r": hints})
    return {**_finish(rng, nodes, providers), "policy": rng.choice(("best-effort", "restricted"))}


def _node_ids(rng: random.Random, count: int) -> list[int]:
    shape = rng.random()
    if shape < 0.15:
        return rng.sample(range(140), count)  # sparse, maybe past 63
    nodes = list(range(count))
    if shape < 0.3:
        rng.shuffle(nodes)
    return nodes


def _random_provider(rng: random.Random, ids: list[int], budget: int) -> tuple[dict | None, int]:
    shape = rng.random()
    if shape < 0.1:
        return None, budget
    if shape < 0.2:
        return {}, budget
    resources = {}
    for name in rng.sample(["cpu", "memory", "hugepages-1Gi", "gpu"], rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.1:
            resources[name] = None
        elif kind < 0.2:
            resources[name] = []
        else:
            size = rng.randint(1, max(1, min(6, budget)))
            budget = max(1, budget // size)
            resources[name] = [_random_hint(rng, ids) for _ in range(size)]
    return resources, budget


def _random_hint(rng: random.Random, ids: list[int]) -> Hint:
    shape = rng.random()
    if shape < 0.15 or not ids:
        affinity = None
    elif shape < 0.2:
        affinity = frozenset()
    else:
        affinity = frozenset(rng.sample(ids, min(len(ids), rng.choice((1, 1, 2, 2, 3, len(ids))))))
    return Hint(affinity, rng.random() < 0.5)


def _finish(rng: random.Random, nodes: list[int], providers: list) -> dict:
    spread = rng.choice((2, 3, 30))  # narrow ranges make equal averages (ties) common
    distances = [[10 if i == j else 10 + rng.randrange(spread) for j in range(len(nodes))]
                 for i in range(len(nodes))]
    options = {}
    if rng.random() < 0.5:
        options["prefer-closest-numa-nodes"] = rng.choice(("true", "1", "True"))
    elif rng.random() < 0.3:
        options["prefer-closest-numa-nodes"] = "false"
    if len(nodes) > 8:
        options["max-allowable-numa-nodes"] = str(len(nodes))
    return {"policy": rng.choice(POLICIES), "numa_nodes": nodes, "providers_hints": providers,
            "distances": distances, "options": options}


def assert_same_answer(case: dict) -> None:
    expected = baseline_merge(case["policy"], case["numa_nodes"], case["providers_hints"],
                              distances=case["distances"], options=case["options"])
    got = merge_hints(case["policy"], case["numa_nodes"], case["providers_hints"],
                      distances=case["distances"], options=case["options"])
    assert got == expected, case


def reversed_resources(case: dict) -> dict:
    flipped = [p if not p else dict(reversed(list(p.items()))) for p in case["providers_hints"]]
    return {**case, "providers_hints": flipped}


@pytest.mark.parametrize("seed", range(6))
def test_seeded_random_cases(seed):
    rng = random.Random(seed)
    for _ in range(200):
        case = random_case(rng)
        assert_same_answer(case)
        assert merge_hints(**reversed_resources(case)) == merge_hints(**case)


def test_long_lists_use_the_transform_join_and_agree(monkeypatch):
    transform_joins = []
    real_join = bitmask._join_by_transform

    def counting_join(*args):
        transform_joins.append(args[2])
        return real_join(*args)

    monkeypatch.setattr(bitmask, "_join_by_transform", counting_join)
    rng = random.Random(99)
    for _ in range(80):
        assert_same_answer(wide_case(rng))
    assert len(transform_joins) >= 30  # about half of these cases are merged by transform


@st.composite
def cases(draw) -> dict:
    return random_case(random.Random(draw(st.integers(min_value=0, max_value=2**32))))


def hinted_cases() -> st.SearchStrategy[dict]:
    """Cases built by hypothesis itself (so it can shrink them), on up to 6 nodes."""
    masks = st.one_of(st.none(), st.frozensets(st.integers(0, 6), max_size=4))
    hint = st.builds(Hint, masks, st.booleans())
    hint_list = st.one_of(st.none(), st.lists(hint, max_size=3))
    provider = st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b", "c"]), hint_list, max_size=2))

    @st.composite
    def build(draw) -> dict:
        count = draw(st.integers(0, 6))
        table = draw(st.lists(st.lists(st.integers(10, 12), min_size=count, max_size=count),
                              min_size=count, max_size=count))
        return {"policy": draw(st.sampled_from(POLICIES)), "numa_nodes": list(range(count)),
                "providers_hints": draw(st.lists(provider, max_size=3)), "distances": table,
                "options": draw(st.sampled_from([{}, {"prefer-closest-numa-nodes": "true"}]))}

    return build()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_hypothesis_random_cases(case):
    assert_same_answer(case)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hinted_cases())
def test_hypothesis_built_cases(case):
    assert_same_answer(case)
    assert merge_hints(**reversed_resources(case)) == merge_hints(**case)
