"""The merge inside a set of NUMA nodes (``MachineMerge.merge(..., within=)``, the scheduler's
chosen nodes) against a plain definition: the kubelet's fold over every combination, skipping
the merged hints with a node outside the set. Same seeded cases as the merge's own equivalence
test."""

from __future__ import annotations

import random

import pytest

from bench.baseline_merge import (_HintMerger, _bits, _mask, filter_providers_hints,
                                  filter_single_numa_hints, iterate_all_provider_topology_hints,
                                  merge_permutation)
from nri_numa.engine import Hint
from nri_numa.engine.merge import MachineMerge
from nri_numa.engine.policy.options import parse_policy_options
from tests.property.test_merge_equivalence import random_case


def reference(case: dict, within: frozenset[int]) -> tuple[Hint, bool]:
    policy, nodes = case["policy"], case["numa_nodes"]
    if policy == "none":
        return Hint(None, False), True
    slots = filter_providers_hints(case["providers_hints"])
    if all(hint == (None, True) for slot in slots for hint in slot):
        inside = None  # nothing asks for alignment: nothing to narrow
    else:
        inside = _mask(within)
    if policy == "single-numa-node":
        slots = filter_single_numa_hints(slots)
    opts = parse_policy_options(case["options"])
    closest = opts.prefer_closest_numa_nodes and policy != "single-numa-node"
    merger = _HintMerger(list(nodes), case["distances"] if closest else None, slots)
    default = _mask(nodes)
    best: list = [None]

    def visit(permutation) -> None:
        candidate = merge_permutation(default, permutation)
        if inside is None or not candidate[0] & ~inside:
            best[0] = merger.compare(best[0], candidate)

    iterate_all_provider_topology_hints(slots, visit)
    mask, preferred = best[0] if best[0] is not None else (default, False)
    if policy == "single-numa-node" and mask == default:
        return Hint(None, preferred), preferred
    return Hint(_bits(mask), preferred), (True if policy == "best-effort" else preferred)


@pytest.mark.parametrize("seed", range(4))
def test_inside_the_chosen_nodes_the_merge_is_the_kubelets_fold_restricted(seed):
    rng = random.Random(f"within-{seed}")
    checked = narrowed = 0
    while checked < 150:
        case = random_case(rng)
        nodes = case["numa_nodes"]
        if not nodes:
            continue
        within = frozenset(rng.sample(nodes, rng.randint(1, len(nodes))))
        machine = MachineMerge.build(nodes, distances=case["distances"], options=case["options"])
        plain = machine.merge(case["policy"], case["providers_hints"])
        got = machine.merge(case["policy"], case["providers_hints"], within)
        assert got == reference(case, within), (case, within)
        # The plain answer inside the set is the answer inside it too.
        if plain[0].affinity is not None and plain[0].affinity <= within:
            assert got == plain
        narrowed += got != plain
        checked += 1
    assert narrowed > 10  # the set did change answers
