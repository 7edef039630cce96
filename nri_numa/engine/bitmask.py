"""NUMA masks as Python ints: bit i set means NUMA node id i is in the set.

The kubelet stores masks in a uint64 and rejects ids above 63; Python ints have no such limit, so
ids of any size work here, and for ids below 64 every order below is the kubelet's exactly.

Hint generation walks every mask of the machine's nodes; ``kubelet_order(width)`` keeps that
order per width, and ``subset_sums`` gives a per-node quantity summed over every mask at once.

Besides the kubelet's operations this module holds the one set algebra the merge needs:
``nonzero_intersections(families, width)``, every non-zero AND taking one mask from each family,
computed pairwise or, when the sets are large and the universe small, with superset-sum
transforms over all ``2**width`` masks at once (see docs/merge-algorithm.md).
"""

from __future__ import annotations

import itertools
import operator
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence, Set
from functools import lru_cache

# Above this width a transform vector (8 bytes per mask) passes 512 KiB and a join by transform
# takes seconds; hint lists long enough to need it cannot be built at such widths anyway.
MAX_TRANSFORM_WIDTH = 16
# Lane masks (32 KiB each) and mask orders (4,095 masks) are cached up to this width; wider
# ones are rebuilt when needed.
_CACHED_WIDTH = 12
# A list of every mask of this many nodes would have more entries than a list can index.
_LISTABLE_WIDTH = sys.maxsize.bit_length()

# Lane width of the transform vectors, and the largest count a lane may hold.
_LANE_BYTES = 8
_LANE_BITS = 8 * _LANE_BYTES
_LANE_LIMIT = 1 << (_LANE_BITS - 1)

# Costs in units of one pairwise AND-and-insert (about 45 ns on CPython 3.11): a transform join
# has a fixed part, then per lane its list conversions and product, and per lane and bit its
# three transforms. Measured; they only steer the choice, both methods give the same set.
_TRANSFORM_FIXED_COST = 250.0
_LANE_COST = 7.0
_LANE_STEP_COST = 0.5


def mask_of(ids: Iterable[int]) -> int:
    """The mask holding exactly ``ids``; a negative or non-integer id raises ValueError."""
    mask = 0
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise ValueError(f"NUMA node id must be a non-negative integer, got {i!r}")
        mask |= 1 << i
    return mask


def count(mask: int) -> int:
    """Number of nodes in ``mask``."""
    return mask.bit_count()


def bits(mask: int) -> list[int]:
    """Node ids in ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def is_narrower(a: int, b: int) -> bool:
    """The kubelet's IsNarrowerThan: fewer nodes first, then the unsigned integer order (its
    IsLessThan: {1,2} = 6 is less than {0,3} = 9)."""
    ca, cb = a.bit_count(), b.bit_count()
    if ca == cb:
        return a < b
    return ca < cb


def iterate_masks(ids: Sequence[int]) -> Iterator[int]:
    """Every non-empty subset of ``ids`` in the kubelet's IterateBitMasks order.

    By size first (1, 2, ..., n), then lexicographically by position in ``ids`` as given; for
    ``[0, 1, 2]``: {0}, {1}, {2}, {0,1}, {0,2}, {1,2}, {0,1,2}.
    """
    singles = [1 << i for i in ids]
    for size in range(1, len(singles) + 1):
        for combo in itertools.combinations(singles, size):
            mask = 0
            for single in combo:
                mask |= single
            yield mask


def kubelet_order(width: int) -> tuple[int, ...]:
    """``iterate_masks(range(width))`` as a tuple, built once per width up to ``_CACHED_WIDTH``
    (hint generation walks it on every admission; wider ones are too big to keep).
    OverflowError where ``2**width`` passes what a list can index."""
    _check_listable(width)
    if width <= _CACHED_WIDTH:
        return _cached_kubelet_order(width)
    return tuple(iterate_masks(range(width)))


@lru_cache(maxsize=None)
def _cached_kubelet_order(width: int) -> tuple[int, ...]:
    return tuple(iterate_masks(range(width)))


def subset_sums(values: Sequence[int]) -> list[int]:
    """``sums[m]`` = the sum of ``values[i]`` over the bits ``i`` of ``m``, for every ``m`` below
    ``2**len(values)``: each value doubles the filled part, one comprehension per value.
    OverflowError where ``2**len(values)`` passes what a list can index."""
    _check_listable(len(values))
    sums = [0] * (1 << len(values))
    filled = 1
    for value in values:
        sums[filled:2 * filled] = [s + value for s in sums[:filled]]
        filled *= 2
    return sums


def _check_listable(width: int) -> None:
    if width >= _LISTABLE_WIDTH:
        raise OverflowError(f"{width} NUMA nodes have 2**{width} masks, more than a list can hold")


def nonzero_intersections(families: Sequence[Set[int]], width: int) -> set[int]:
    """Every non-zero ``full & m1 & m2 & ...`` taking one mask from each family, masks below
    ``2**width`` (``full`` = all ``width`` bits; no families gives ``{full}``).

    Families are joined smallest first, pair by pair while that is cheap; once a join would cost
    more than a pass of the transform over all ``2**width`` masks, the remaining families are
    joined by transform (``_join_by_transform``). Both ways give the same set.
    """
    reach = {(1 << width) - 1} - {0}
    pending = sorted(families, key=len)
    for index, family in enumerate(pending):
        if not reach:
            break
        if width <= MAX_TRANSFORM_WIDTH and _transform_cost(width) < len(reach) * len(family):
            return _join_by_transform(reach, pending[index:], width)
        reach = {r & m for r in reach for m in family}
        reach.discard(0)  # zero stays zero: drop it early
    return reach


def nonzero_intersections_pairwise(families: Sequence[Set[int]], width: int) -> set[int]:
    """``nonzero_intersections`` one pair at a time only: the plain definition, for checking."""
    reach = {(1 << width) - 1}
    for family in families:
        reach = {r & m for r in reach for m in family}
    return reach - {0}


def nonzero_intersections_by_transform(families: Sequence[Set[int]], width: int) -> set[int]:
    """``nonzero_intersections`` by transform only (widths up to ``MAX_TRANSFORM_WIDTH``)."""
    if width > MAX_TRANSFORM_WIDTH:
        raise ValueError(f"transform joins go up to {MAX_TRANSFORM_WIDTH} nodes, not {width}")
    start = {(1 << width) - 1} - {0}
    return _join_by_transform(start, families, width) if start else set()


def _join_by_transform(reach: Set[int], families: Sequence[Set[int]], width: int) -> set[int]:
    """The AND of one mask per family for all combinations at once.

    With ``up(f)(S) = sum of f(a) over a ⊇ S`` (the superset-sum transform), the number of
    combinations whose AND contains S is the product over the families of ``up(family)(S)``;
    undoing the transform on that product gives, for every S, the number of combinations whose
    AND is exactly S, and the answer is the S where that is not zero. Each transform is ``width``
    big-integer steps over 64-bit lanes, one lane per mask: ``O(width * 2**width)`` per family,
    whatever the families' sizes. A lane holds at most the product of the family sizes; when
    that would pass 2**63 the counts so far are turned back into a set and the product restarts.
    """
    size = 1 << width
    product, bound = _unpack(_up(_indicator(reach, size), width), size), len(reach)
    for family in families:
        if not family:
            return set()
        if bound * len(family) >= _LANE_LIMIT:
            exact = _unpack(_down(_pack(product), width), size)
            product = _unpack(_up(_pack([1 if c else 0 for c in exact]), width), size)
            bound = size
        product = list(map(operator.mul, product, _unpack(_up(_indicator(family, size), width), size)))
        bound *= len(family)
    exact = _unpack(_down(_pack(product), width), size)
    exact[0] = 0
    return set(itertools.compress(range(size), exact))


def _transform_cost(width: int) -> float:
    return _TRANSFORM_FIXED_COST + (1 << width) * (_LANE_COST + _LANE_STEP_COST * width)


def _indicator(masks: Set[int], size: int) -> int:
    lanes = bytearray(size * _LANE_BYTES)
    for m in masks:
        lanes[m * _LANE_BYTES] = 1
    return int.from_bytes(lanes, "little")


def _pack(lanes: list[int]) -> int:
    return int.from_bytes(array("Q", lanes).tobytes(), "little")


def _unpack(vector: int, size: int) -> list[int]:
    lanes = array("Q")
    lanes.frombytes(vector.to_bytes(size * _LANE_BYTES, "little"))
    return lanes.tolist()


def _up(vector: int, width: int) -> int:
    """Superset sums: lane S becomes the sum of lanes T ⊇ S."""
    for j in range(width):
        vector += (vector >> (_LANE_BITS << j)) & _lanes_without_bit(width, j)
    return vector


def _down(vector: int, width: int) -> int:
    """Inverse of ``_up``. Every intermediate lane is a count of combinations, never negative, so
    the big-integer subtraction never borrows across lanes."""
    for j in range(width):
        vector -= (vector >> (_LANE_BITS << j)) & _lanes_without_bit(width, j)
    return vector


def _lanes_without_bit(width: int, j: int) -> int:
    """All-ones in the lanes of masks that lack bit ``j``, zero elsewhere."""
    if width <= _CACHED_WIDTH:
        return _cached_lanes_without_bit(width, j)
    return _build_lanes_without_bit(width, j)


@lru_cache(maxsize=None)
def _cached_lanes_without_bit(width: int, j: int) -> int:
    return _build_lanes_without_bit(width, j)


def _build_lanes_without_bit(width: int, j: int) -> int:
    run = _LANE_BYTES << j
    period = b"\xff" * run + b"\x00" * run
    return int.from_bytes(period * ((1 << width) >> (j + 1)), "little")
