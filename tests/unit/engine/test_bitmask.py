"""NUMA masks: the kubelet's bitmask cases (bitmask_test.go), ids past 63, and the set algebra."""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.bitmask import (
    bits,
    count,
    is_narrower,
    iterate_masks,
    mask_of,
    nonzero_intersections,
    nonzero_intersections_by_transform,
    nonzero_intersections_pairwise,
)


@pytest.mark.parametrize("ids, mask", [
    ([], 0b00), ([0], 0b01), ([1], 0b10), ([0, 1], 0b11), ([1, 0, 1], 0b11), ([64], 1 << 64),
    ([0, 130], 1 | 1 << 130),
])
def test_mask_of(ids, mask):
    assert mask_of(ids) == mask


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True])
def test_mask_of_rejects_what_is_not_a_node_id(bad):
    with pytest.raises(ValueError, match="NUMA node id must be a non-negative integer"):
        mask_of([0, bad])


@pytest.mark.parametrize("ids, expected_count", [([], 0), ([0], 1), ([0, 1], 2), ([3, 63, 64, 200], 4)])
def test_count_and_bits(ids, expected_count):
    assert count(mask_of(ids)) == expected_count
    assert bits(mask_of(ids)) == sorted(ids)


@pytest.mark.parametrize("masks, anded", [
    ([[0, 1], [0, 1]], [0, 1]),
    ([[0, 1], [1]], [1]),
    ([[0], [0, 1]], [0]),
    ([[0, 1], [0, 1], [1]], [1]),
    ([[0], [0], [1], [0, 1]], []),
    ([[0, 1, 2, 3], [1, 2, 3], [2, 3], [3]], [3]),
])
def test_and_of_masks_as_in_the_kubelet(masks, anded):
    result = mask_of(masks[0])
    for m in masks:
        result &= mask_of(m)
    assert bits(result) == anded


@pytest.mark.parametrize("first, second, narrower", [
    ([0], [0, 1], True),      # unequal counts 1/2
    ([0, 1], [0], False),     # unequal counts 2/2
    ([0], [1], True),         # equal counts 1/2
    ([1], [0], False),        # equal counts 2/2
    ([1, 2], [0, 3], True),   # integer order, not "lower bits": 6 < 9
    ([0, 3], [1, 2], False),
    ([0, 64], [1, 64], True),  # beyond the kubelet's 64 bits the same order continues
    ([0], [0], False),
])
def test_is_narrower(first, second, narrower):
    assert is_narrower(mask_of(first), mask_of(second)) is narrower


def test_iterate_masks_order_matches_iterate_bit_masks():
    got = [bits(m) for m in iterate_masks([0, 1, 2])]
    assert got == [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]]


def test_iterate_masks_follows_the_order_ids_are_given_in():
    # positions, not values, decide the order within one size
    assert [bits(m) for m in iterate_masks([5, 2])] == [[5], [2], [2, 5]]


@pytest.mark.parametrize("numbits", [0, 1, 2, 4, 8, 16])
def test_iterate_masks_visits_every_non_empty_mask_once(numbits):
    masks = list(iterate_masks(range(numbits)))
    assert len(masks) == (1 << numbits) - 1
    assert set(masks) == set(range(1, 1 << numbits))
    assert [count(m) for m in masks] == sorted(count(m) for m in masks)


def test_iterate_masks_past_63():
    assert list(iterate_masks([63, 64])) == [1 << 63, 1 << 64, (1 << 63) | (1 << 64)]


def _random_families(rng: random.Random, width: int) -> list[set[int]]:
    return [{rng.randrange(1 << width) for _ in range(rng.randrange(0, 40))}
            for _ in range(rng.randrange(0, 5))]


@pytest.mark.parametrize("width", range(0, 10))
def test_transform_join_equals_the_pairwise_join(width):
    rng = random.Random(width)
    for _ in range(150):
        families = _random_families(rng, width)
        expected = nonzero_intersections_pairwise(families, width)
        assert nonzero_intersections_by_transform(families, width) == expected
        assert nonzero_intersections(families, width) == expected


def test_transform_join_restarts_before_lanes_overflow():
    # 9 families of 256 masks: 256**9 combinations would overflow a 64-bit lane.
    width = 8
    families = [set(range(1 << width)) for _ in range(8)] + [{0b1010_0101, 0b0101_1111}]
    expected = {m for m in range(1, 1 << width) if m & ~0b1010_0101 == 0 or m & ~0b0101_1111 == 0}
    assert nonzero_intersections_by_transform(families, width) == expected


def test_transform_join_refuses_wide_universes():
    with pytest.raises(ValueError, match="transform joins go up to"):
        nonzero_intersections_by_transform([{1}], 64)


def test_nonzero_intersections_small_cases():
    assert nonzero_intersections([], 3) == {0b111}
    assert nonzero_intersections([], 0) == set()
    assert nonzero_intersections([{0b011, 0b110}, {0b010, 0b100}], 3) == {0b010, 0b100}
    assert nonzero_intersections([{0b001}, {0b010}], 3) == set()
    assert nonzero_intersections([{0b001}, set()], 3) == set()
