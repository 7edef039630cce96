"""What the engine keeps between admissions gives the answers it would compute afresh.

The admission path keeps per-machine work (a prepared merge, shared hint values, mask orders)
and carries the shared pool as a bit mask from one snapshot to the next. Each test here checks
one of those against the value computed from scratch, on seeded random inputs.
"""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.annotations import pod_topology
from nri_numa.engine.bitmask import bits, iterate_masks, kubelet_order, subset_sums
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.cpu import checked_mask
from nri_numa.engine.hints import Hint, hint_of_mask, hints_of_masks
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.merge import MachineMerge, merge_hints
from nri_numa.topology.synthetic import preset_topology
from tests.property.test_merge_equivalence import POLICIES, random_case


@pytest.mark.parametrize("width", range(0, 9))
def test_kubelet_order_and_subset_sums_match_their_definitions(width):
    rng = random.Random(width)
    values = [rng.randint(0, 50) for _ in range(width)]
    assert kubelet_order(width) == tuple(iterate_masks(range(width)))
    assert subset_sums(values) == [sum(values[i] for i in bits(m)) for m in range(1 << width)]


def test_tables_over_every_mask_refuse_widths_no_list_can_hold():
    with pytest.raises(OverflowError, match="64 NUMA nodes"):
        kubelet_order(64)
    with pytest.raises(OverflowError, match="64 NUMA nodes"):
        subset_sums([1] * 64)


def test_shared_hints_equal_new_ones():
    rng = random.Random(3)
    for _ in range(50):
        masks = sorted((rng.getrandbits(rng.choice([3, 8, 70])) for _ in range(rng.randint(0, 40))),
                       key=int.bit_count)  # fewest nodes first, as hint lists come
        for size in range(0, 6):
            expected = [Hint(bits(m), m.bit_count() == size) for m in masks]
            assert hints_of_masks(masks, size) == expected
            assert hints_of_masks(tuple(masks), size) == expected
    assert hint_of_mask(5, True) is hint_of_mask(5, True)
    assert hint_of_mask(5, False) == Hint({0, 2}, False)


@pytest.mark.parametrize("seed", range(4))
def test_a_prepared_merge_answers_like_merge_hints_call_after_call(seed):
    rng = random.Random(seed)
    for _ in range(100):
        case = random_case(rng)
        machine = MachineMerge.build(case["numa_nodes"], distances=case["distances"],
                                     options=case["options"])
        expected = merge_hints(**case)
        assert machine.merge(case["policy"], case["providers_hints"]) == expected
        assert machine.merge(case["policy"], case["providers_hints"]) == expected
        for policy in POLICIES:  # every provider without a preference: kept per policy
            for providers in ([None], [None, {}], [{"cpu": None}, None, {}]):
                fresh = merge_hints(policy, case["numa_nodes"], providers,
                                    distances=case["distances"], options=case["options"])
                assert machine.merge(policy, providers) == fresh
                assert machine.merge(policy, providers) == fresh


def _pod(rng: random.Random, name: str):
    limits = {"cpu": str(rng.randint(1, 9)), "memory": f"{rng.randint(1, 8)}Gi"}
    containers = [{"name": "main", "resources": {"limits": limits}}]
    if rng.random() < 0.3:
        containers.append({"name": "side", "resources": {"limits": {"cpu": "250m",
                                                                    "memory": "256Mi"}}})
    if rng.random() < 0.2:
        containers = [{"name": "main", "resources": {"requests": {"cpu": "500m"}}}]
    return pod_from_manifest({"metadata": {"name": name, "namespace": "t"},
                              "spec": {"containers": containers}})


@pytest.mark.parametrize("policy", ["single-numa-node", "best-effort"])
def test_the_shared_pool_mask_follows_the_pool_through_admissions_and_releases(policy):
    ctx = EngineContext.build(preset_topology("amd-epyc-2s-nps4"), config_from_mapping({
        "topologyManagerPolicy": policy, "cpuManagerPolicy": "static",
        "reservedSystemCPUs": "0,128", "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}))
    rng = random.Random(7)
    allocs = ctx.empty_allocations()
    admitted = []
    for i in range(60):
        if admitted and rng.random() < 0.3:
            allocs = release(ctx, allocs, admitted.pop(rng.randrange(len(admitted))))
        else:
            result = admit(ctx, allocs, _pod(rng, f"p{i}"))
            if result.decision.admitted:
                allocs = result.allocations
                admitted.append(result.decision.pod)
        assert allocs.shared_mask == checked_mask(allocs.shared, "shared")
        ctx.check(allocs)
    assert admitted


def test_a_pool_set_without_its_mask_is_converted_again():
    ctx = EngineContext.build(preset_topology("amd-epyc-2s-nps4"), config_from_mapping({
        "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,128"}))
    allocs = ctx.empty_allocations()
    assert allocs.shared_mask == checked_mask(allocs.shared, "shared")
    smaller = allocs.with_shared(allocs.shared - {5, 6})
    assert smaller.shared_mask == allocs.shared_mask & ~(1 << 5 | 1 << 6)


def test_pods_without_annotations_get_the_nodes_policy_and_scope():
    ctx = EngineContext.build(preset_topology("amd-epyc-2s-nps4"), config_from_mapping({
        "topologyManagerPolicy": "restricted", "topologyManagerScope": "pod"}))
    assert ctx.node_topology == pod_topology(ctx.config, {})
