"""The Topology Manager's hint merge: the kubelet's answer, without walking the cross product.

``merge_hints(policy, numa_nodes, providers_hints, distances=..., options=...)`` returns the hint
the kubelet's policy would return for these provider hints, and whether it admits the pod.

The kubelet merges every combination of one hint per resource ("permutation") and keeps the best
under its HintMerger comparison. That comparison is a total order on merged hints, so the answer
is the best element of the *set* of merged hints, which this module finds without enumerating:

* a merged hint is preferred only if every hint in it is preferred and all of them that name
  nodes name the same nodes; so the preferred candidates are found mask by mask, by set
  intersection over the resources;
* otherwise the answer is non-preferred, and its mask is the best, under the kubelet's
  non-preferred ranking, of the set of reachable intersections ``{D & m1 & m2 & ...}``, built
  resource by resource as a set (``bitmask.nonzero_intersections``) rather than combination by
  combination.

docs/merge-algorithm.md has the argument that this is exactly the kubelet's answer, and the costs.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from nri_numa.engine.bitmask import bits, nonzero_intersections
from nri_numa.engine.hints import Hint, MergeError, Slot
from nri_numa.engine.numa_info import FitterKey, NumaInfo
from nri_numa.engine.policy import policy_by_name
from nri_numa.engine.policy.options import parse_policy_options

ProviderHints = Mapping[str, Sequence[Hint] | None] | None

_NO_PREFERENCE: Slot = (Hint(None, True),)
_NO_NODE_FITS: Slot = (Hint(None, False),)
_MASK_OF = operator.attrgetter("mask")
_PREFERRED = operator.attrgetter("preferred")


def merge_hints(policy: str, numa_nodes: Sequence[int], providers_hints: Sequence[ProviderHints], *,
                distances: Sequence[Sequence[int]] | None = None,
                options: Mapping[str, str] | None = None) -> tuple[Hint, bool]:
    """The merged hint and whether ``policy`` admits it.

    ``providers_hints``: one entry per provider, ``None`` or ``{}`` for no preference, else
    resource → hints, where ``None`` is no preference and ``[]`` means no NUMA node can serve
    the resource. ``distances`` is indexed like ``numa_nodes`` and only read with
    ``prefer-closest-numa-nodes``. Checks run in the kubelet's order: options, NUMA info, the
    node limit, the policy name.
    """
    opts = parse_policy_options(options)
    if opts.prefer_closest_numa_nodes and distances is None:
        raise MergeError("cannot discover NUMA topology: prefer-closest-numa-nodes is on "
                         "but no NUMA distances were given")
    # Like the kubelet, distances are only read when prefer-closest-numa-nodes asks for them.
    info = NumaInfo(tuple(_node_list(numa_nodes)), distances if opts.prefer_closest_numa_nodes else None)
    if policy != "none" and len(info.nodes) > opts.max_allowable_numa_nodes:
        raise MergeError(f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes")
    chosen = policy_by_name(policy)
    slots = provider_slots(providers_hints)
    merger = HintMerger(info, opts.prefer_closest_numa_nodes)
    return chosen.decide(slots, merger.merge, frozenset(info.nodes))


def provider_slots(providers_hints: Sequence[ProviderHints]) -> list[Slot]:
    """The kubelet's filterProvidersHints: one hint list ("slot") per resource, in order."""
    if not _is_list(providers_hints):
        raise MergeError(f"providers_hints: expected a list with one entry per provider, got {providers_hints!r}")
    slots: list[Slot] = []
    for index, resources in enumerate(providers_hints):
        if resources is None or (_is_mapping(resources) and not resources):
            slots.append(_NO_PREFERENCE)
            continue
        if not _is_mapping(resources):
            raise MergeError(f"providers_hints[{index}]: expected a mapping resource → hints or None, "
                             f"got {resources!r}")
        for resource, hints in resources.items():
            slots.append(_slot(f"providers_hints[{index}][{resource!r}]", hints))
    return slots


@dataclass(frozen=True)
class HintMerger:
    """The kubelet's HintMerger over the machine's NUMA nodes; ``merge`` is the whole merge."""

    info: NumaInfo
    prefer_closest: bool

    def merge(self, slots: Sequence[Slot], closest_allowed: bool) -> Hint:
        info = self.info
        fitter = info.fitter_key(self.prefer_closest and closest_allowed)
        if any(not slot for slot in slots):
            # Some resource has no hint at all: there is no combination to merge.
            return self._hint(info.default_mask, False)
        universe = _Universe(info.nodes)
        summaries = [_summarize(slot, universe) for slot in slots]
        preferred = _best_preferred(summaries, info.default_mask, fitter)
        if preferred is not None:
            return self._hint(preferred, True)
        fallback = _best_non_preferred(summaries, universe, fitter)
        return self._hint(info.default_mask if fallback is None else fallback, False)

    def _hint(self, mask: int, preferred: bool) -> Hint:
        return Hint(frozenset(bits(mask)), preferred)


class _SlotSummary(NamedTuple):
    preferred_masks: set[int]  # masks of the preferred hints that name nodes, as given
    preferred_none: bool  # some preferred hint names no node
    restrictions: set[int]  # each hint's nodes on this machine (all of them for None), packed
    narrowest_count: int | None  # nodes in the slot's narrowest hint that names nodes


class _Universe:
    """The machine's node ids packed to bit positions 0..n-1, ascending.

    Packing keeps counts and the integer order of masks, so every comparison the kubelet makes
    gives the same result on packed masks; it only matters for sparse ids (nodes 0 and 100).
    """

    def __init__(self, nodes: Iterable[int]) -> None:
        self.ids = sorted(nodes)
        self.width = len(self.ids)
        self.full = (1 << self.width) - 1
        self.default_mask = sum(1 << i for i in self.ids)
        self.identity = self.default_mask == self.full

    def pack(self, mask: int) -> int:
        mask &= self.default_mask
        if self.identity:
            return mask
        return sum(1 << pos for pos, node in enumerate(self.ids) if mask >> node & 1)

    def unpack(self, packed: int) -> int:
        if self.identity:
            return packed
        return sum(1 << self.ids[pos] for pos in bits(packed))


def _summarize(slot: Slot, universe: _Universe) -> _SlotSummary:
    # map/compress keep the per-hint work in C: slots hold up to 2**n - 1 hints.
    masks = list(map(_MASK_OF, slot))
    distinct = set(masks)
    has_none = None in distinct
    distinct.discard(None)
    preferred = set(itertools.compress(masks, map(_PREFERRED, slot)))
    preferred_none = None in preferred
    preferred.discard(None)
    if not universe.identity:
        restrictions = {universe.pack(m) for m in distinct}
    elif distinct and max(distinct) > universe.full:
        restrictions = {m & universe.full for m in distinct}
    else:
        restrictions = set(distinct)  # every mask already lies on the machine
    if has_none:
        restrictions.add(universe.full)
    return _SlotSummary(preferred, preferred_none, restrictions, min(map(int.bit_count, distinct), default=None))


def _best_preferred(summaries: list[_SlotSummary], default_mask: int, fitter: FitterKey) -> int | None:
    """The fittest mask of a preferred merged hint, or None when no combination is preferred.

    A combination is preferred when every hint in it is preferred and those naming nodes all name
    the same mask M (it merges to M on this machine), or none names nodes (it merges to the whole
    machine). So M works when every resource has M among its preferred hints or a preferred hint
    without nodes; empty merges do not count.
    """
    constrained = [s.preferred_masks for s in summaries if not s.preferred_none]
    if constrained:
        shared = set.intersection(*constrained)
    else:
        shared = set().union(*(s.preferred_masks for s in summaries))
    candidates = {m & default_mask for m in shared}
    if not constrained:
        candidates.add(default_mask)
    candidates.discard(0)
    return min(candidates, key=fitter) if candidates else None


def _best_non_preferred(summaries: list[_SlotSummary], universe: _Universe, fitter: FitterKey) -> int | None:
    """The mask the kubelet keeps when no merged hint is preferred (None: every merge was empty).

    The kubelet ranks non-preferred masks by their node count against ``target`` (the most nodes
    any resource needs at least): exactly ``target`` first, then fewer nodes (more is better), then
    more nodes (fewer is better); within a count by the fitter order.
    """
    target = max((s.narrowest_count for s in summaries if s.narrowest_count is not None), default=0)
    reach = nonzero_intersections([s.restrictions for s in summaries], universe.width)
    if not reach:
        return None

    def rank(count: int) -> int:
        if count == target:
            return 0
        return target - count if count < target else count

    best_count = min(set(map(int.bit_count, reach)), key=rank)
    tier = [m for m in reach if m.bit_count() == best_count]
    return min(map(universe.unpack, tier), key=fitter)


def _slot(where: str, hints: object) -> Slot:
    if hints is None:
        return _NO_PREFERENCE
    if not _is_list(hints):
        raise MergeError(f"{where}: expected a list of Hint or None, got {hints!r}")
    if not hints:
        return _NO_NODE_FITS
    slot = tuple(hints)
    if set(map(type, slot)) != {Hint}:  # the quick check, in C; subclasses are fine too
        for position, hint in enumerate(slot):
            if not isinstance(hint, Hint):
                raise MergeError(f"{where}[{position}]: expected a Hint, got {hint!r}")
    return slot


def _is_list(value: object) -> bool:
    # The type test first: ABC isinstance checks cost more than the rest of a small merge.
    return type(value) in (list, tuple, range) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, Mapping)))


def _is_mapping(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def _node_list(numa_nodes: Sequence[int]) -> Sequence[int]:
    if not _is_list(numa_nodes):
        raise MergeError(f"numa_nodes: expected a list of NUMA node ids, got {numa_nodes!r}")
    return numa_nodes
