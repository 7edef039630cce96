"""Hints past the kubelet's reach: a bounded list instead of every NUMA mask.

The kubelet's providers list every mask that can hold a request — ``2ⁿ − 1`` of them — which is
why it stops at 8 NUMA nodes. Restricted and single-numa-node decisions depend on preferred hints
only, and those are the feasible masks of the smallest size that an empty machine could use
(docs/merge-algorithm.md). So past ``EXACT_NODE_LIMIT`` nodes a provider lists:

* every feasible mask of that minimal size ``k`` while there are at most ``MAX_ENUMERATED``
  masks of size ``k`` (all single nodes, and pairs up to 64 nodes); beyond that, the nearest-node
  groups of size ``k`` grown from every node;
* for best-effort's fallback, from every node the nearest nodes (by distance) until the free
  capacity covers the request, groups already formed, and the widest mask allowed (the whole
  machine, less nodes that may not join a new group) — at most ``n + 1`` more plus the groups.

Up to ``EXACT_NODE_LIMIT`` nodes providers keep the kubelet's exact enumeration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from math import comb

from nri_numa.engine.hints import Hint

EXACT_NODE_LIMIT = 8
MAX_ENUMERATED = 2080  # C(65, 2): every pair on a 64-node machine, and then some


@dataclass(frozen=True, slots=True)
class Demand:
    """One resource's request against what each NUMA node holds in all and holds free."""

    request: int
    capacity: Mapping[int, int]
    free: Mapping[int, int]

    def fits_capacity(self, nodes: Sequence[int]) -> bool:
        return sum(self.capacity.get(n, 0) for n in nodes) >= self.request

    def fits_free(self, nodes: Sequence[int]) -> bool:
        return sum(self.free.get(n, 0) for n in nodes) >= self.request


def bounded_hints(node_ids: Sequence[int], demands: Sequence[Demand],
                  distances: Mapping[int, Mapping[int, int]], *,
                  required: frozenset[int] = frozenset(),
                  allow: Callable[[tuple[int, ...]], bool] = lambda nodes: True,
                  joinable: Callable[[int], bool] = lambda node: True,
                  groups: Iterable[tuple[int, ...]] = ()) -> list[Hint]:
    """Hints for ``demands`` placed together; ``required`` nodes must be in every mask.

    ``allow`` vets a whole mask; ``joinable`` says whether growth may add a node to a seed
    (the Memory Manager's nodes already in use may not join a new group); ``groups`` are masks
    to offer as they are (groups already formed)."""
    nodes = tuple(sorted(node_ids))
    k = _min_affinity(nodes, demands)
    if k is None:
        return []

    def usable(group: tuple[int, ...]) -> bool:
        return required.issubset(group) and all(d.fits_free(group) for d in demands) and allow(group)

    found: dict[tuple[int, ...], bool] = {}
    if comb(len(nodes), k) <= MAX_ENUMERATED:
        for group in combinations(nodes, k):
            if usable(group):
                found[group] = True
    else:
        for seed in nodes:
            group = _grow(seed, nodes, distances, required, lambda g: len(g) >= k)
            if len(group) == k and usable(group):
                found[group] = True
    grown = (_grow(seed, nodes, distances, required, lambda g: all(d.fits_free(g) for d in demands),
                   joinable) for seed in nodes)
    for group in (*grown, *(tuple(sorted(g)) for g in groups)):
        if group not in found and usable(group):
            found[group] = len(group) == k
    # The widest mask growth may use: the whole machine, less what may not join a group.
    widest = tuple(n for n in nodes if joinable(n) or n in required)
    if widest and widest not in found and usable(widest):
        found[widest] = len(widest) == k
    ordered = sorted(found, key=lambda g: (len(g), sum(1 << n for n in g)))
    return [_hint(g, found[g]) for g in ordered]


@lru_cache(maxsize=8192)
def _hint(group: tuple[int, ...], preferred: bool) -> Hint:
    # Hints are immutable, and admissions on one machine keep asking for the same groups.
    return Hint(group, preferred)


def _min_affinity(nodes: tuple[int, ...], demands: Sequence[Demand]) -> int | None:
    """The fewest nodes whose capacity holds every demand (None: not even the whole machine)."""
    if not all(d.fits_capacity(nodes) for d in demands):
        return None
    k = 1
    for d in demands:  # a lower bound per demand: its largest nodes first
        biggest = sorted((d.capacity.get(n, 0) for n in nodes), reverse=True)
        total = 0
        for size, amount in enumerate(biggest, 1):
            total += amount
            if total >= d.request:
                k = max(k, size)
                break
    while k < len(nodes):
        if comb(len(nodes), k) > MAX_ENUMERATED:
            return k  # too many to check; the per-demand bound stands
        if any(all(d.fits_capacity(g) for d in demands) for g in combinations(nodes, k)):
            return k
        k += 1
    return k


def _grow(seed: int, nodes: tuple[int, ...], distances: Mapping[int, Mapping[int, int]],
          required: frozenset[int], done: Callable[[tuple[int, ...]], bool],
          joinable: Callable[[int], bool] = lambda node: True) -> tuple[int, ...]:
    """``seed`` and the required nodes, then the nearest joinable others until ``done``."""
    group = sorted({seed, *required})
    if done(tuple(group)):
        return tuple(group)
    row = distances.get(seed, {})
    others = (n for n in nodes if n not in group and joinable(n))
    for n in sorted(others, key=lambda n: (row.get(n, 255), n)):
        group.append(n)
        if done(tuple(sorted(group))):
            break
    return tuple(sorted(group))
