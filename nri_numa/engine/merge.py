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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial

from nri_numa.engine.bitmask import bits, nonzero_intersections
from nri_numa.engine.hints import Hint, MergeError, Slot, hint_of_mask
from nri_numa.engine.numa_info import FitterKey, NumaInfo
from nri_numa.engine.policy import policy_by_name
from nri_numa.engine.policy.options import PolicyOptions, parse_policy_options

ProviderHints = Mapping[str, Sequence[Hint] | None] | None

_NO_PREFERENCE: Slot = (Hint(None, True),)
_NO_NODE_FITS: Slot = (Hint(None, False),)


def merge_hints(policy: str, numa_nodes: Sequence[int] | None,
                providers_hints: Sequence[ProviderHints], *,
                distances: Sequence[Sequence[int]] | None = None,
                options: Mapping[str, str] | None = None) -> tuple[Hint, bool]:
    """The merged hint and whether ``policy`` admits it.

    ``providers_hints``: one entry per provider, ``None`` or ``{}`` for no preference, else
    resource → hints, where ``None`` is no preference and ``[]`` means no NUMA node can serve
    the resource. ``distances`` is indexed like ``numa_nodes`` and only read with
    ``prefer-closest-numa-nodes``. Checks run in the kubelet's order: options, NUMA info, the
    node limit, the policy name. Policy ``none`` never reads the machine, so ``numa_nodes``
    may be ``None`` there (the kubelet's own none-policy cases pass nil).
    """
    if policy == "none" and numa_nodes is None:
        parse_policy_options(options)
        if providers_hints is not None:
            provider_slots(providers_hints)
        return policy_by_name(policy).decide((), _no_merge, frozenset())
    return MachineMerge.build(numa_nodes, distances=distances, options=options).merge(
        policy, providers_hints)


def _no_merge(*_args: object) -> Hint:
    raise AssertionError("policy none never merges")


class MachineMerge:
    """``merge_hints`` with its machine arguments (nodes, distances, options) checked and
    prepared once: the engine merges against one machine for its whole life."""

    def __init__(self, info: NumaInfo, options: PolicyOptions) -> None:
        self.info = info
        self.options = options
        self.merger = HintMerger(info, options.prefer_closest_numa_nodes)
        self.default_affinity = frozenset(info.nodes)
        # (policy, slots) → answer, for slots that all say "no preference"
        self._unconstrained: dict[tuple[str, int], tuple[Hint, bool]] = {}

    @classmethod
    def build(cls, numa_nodes: Sequence[int], *, distances: Sequence[Sequence[int]] | None = None,
              options: Mapping[str, str] | None = None) -> MachineMerge:
        """Raise MergeError for bad options or NUMA info, in that order."""
        opts = parse_policy_options(options)
        if opts.prefer_closest_numa_nodes and distances is None:
            raise MergeError("cannot discover NUMA topology: prefer-closest-numa-nodes is on "
                             "but no NUMA distances were given")
        # Like the kubelet, distances are only read when prefer-closest-numa-nodes asks for them.
        info = NumaInfo(tuple(_node_list(numa_nodes)),
                        distances if opts.prefer_closest_numa_nodes else None)
        return cls(info, opts)

    def merge(self, policy: str, providers_hints: Sequence[ProviderHints],
              within: frozenset[int] | None = None) -> tuple[Hint, bool]:
        """``merge_hints`` on this machine: the node limit, the policy name, then the merge.

        ``within``: only merged hints whose nodes lie inside these count (the scheduler's
        choice); the kubelet's ranking among them is unchanged, so when the unrestricted answer
        lies inside, it is the answer here too. When none lies inside, the answer is the
        kubelet's "nothing merged", ``{all nodes, not preferred}``. Slots that all say "no
        preference" have nothing to narrow and are merged as they are; so is policy none."""
        limit = self.options.max_allowable_numa_nodes
        if policy != "none" and len(self.info.nodes) > limit:
            raise MergeError(f"unsupported on machines with more than {limit} NUMA Nodes")
        chosen = policy_by_name(policy)
        slots = provider_slots(providers_hints)
        if within is not None and policy != "none" and _asks_alignment(slots):
            inside = partial(self.merger.merge, within=sum(1 << n for n in within))
            return chosen.decide(slots, inside, self.default_affinity)
        if all(slot is _NO_PREFERENCE for slot in slots):
            # Nothing to align (a Burstable pod, say): the answer depends on the policy alone.
            key = (policy, len(slots))
            if key not in self._unconstrained:
                self._unconstrained[key] = chosen.decide(slots, self.merger.merge,
                                                         self.default_affinity)
            return self._unconstrained[key]
        return chosen.decide(slots, self.merger.merge, self.default_affinity)


def _asks_alignment(slots: Sequence[Slot]) -> bool:
    """Whether any hint names nodes or is not preferred: otherwise every merge is the whole
    machine, preferred, and there is nothing for ``within`` to narrow."""
    return any(h.mask is not None or not h.preferred for slot in slots for h in slot)


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
            slots.append(_slot(index, resource, hints))
    return slots


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class HintMerger:
    """The kubelet's HintMerger over the machine's NUMA nodes; ``merge`` is the whole merge."""

    info: NumaInfo
    prefer_closest: bool

    def merge(self, slots: Sequence[Slot], closest_allowed: bool, within: int | None = None) -> Hint:
        """``within``: a mask of node ids; merged hints with nodes outside it do not count."""
        info = self.info
        closest = self.prefer_closest and closest_allowed
        fitter = self._closest_key if closest else self._narrowest_key
        if any(not slot for slot in slots):
            # Some resource has no hint at all: there is no combination to merge.
            return hint_of_mask(info.default_mask, False)
        # The preferred side first: when it finds a mask, which it usually does, the rest of
        # what a slot could reach is never needed.
        preferred = _best_preferred(list(map(_preferred_side, slots)), info.default_mask, fitter,
                                    within)
        if preferred is not None:
            return hint_of_mask(preferred, True)
        universe = self._universe
        reaches = [_reach(slot, universe) for slot in slots]
        fallback = _best_non_preferred(reaches, universe, fitter, within)
        return hint_of_mask(info.default_mask if fallback is None else fallback, False)

    # What depends on the machine alone, built at the first merge and kept.

    @cached_property
    def _universe(self) -> _Universe:
        return _Universe(self.info.nodes)

    @cached_property
    def _closest_key(self) -> FitterKey:
        return self.info.fitter_key(True)

    @cached_property
    def _narrowest_key(self) -> FitterKey:
        return self.info.fitter_key(False)


# What the merge reads from one slot: the masks of its preferred hints that name nodes (as
# given) and whether a preferred hint names none; then, only when no preferred merge exists,
# each hint's nodes on this machine packed (all of them for None) and the node count of its
# narrowest hint that names nodes.
_Preferred = tuple[set[int], bool]
_Reach = tuple[set[int], int | None]


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


def _preferred_side(slot: Slot) -> _Preferred:
    preferred = {h.mask for h in slot if h.preferred}
    has_none = None in preferred
    preferred.discard(None)
    return preferred, has_none


def _reach(slot: Slot, universe: _Universe) -> _Reach:
    distinct = {h.mask for h in slot}
    has_none = None in distinct
    distinct.discard(None)
    narrowest = min(map(int.bit_count, distinct), default=None)
    if not universe.identity:
        restrictions = {universe.pack(m) for m in distinct}
    elif distinct and max(distinct) > universe.full:
        restrictions = {m & universe.full for m in distinct}
    else:
        restrictions = distinct  # every mask already lies on the machine
    if has_none:
        restrictions.add(universe.full)
    return restrictions, narrowest


def _best_preferred(sides: list[_Preferred], default_mask: int, fitter: FitterKey,
                    within: int | None = None) -> int | None:
    """The fittest mask of a preferred merged hint, or None when no combination is preferred.

    A combination is preferred when every hint in it is preferred and those naming nodes all name
    the same mask M (it merges to M on this machine), or none names nodes (it merges to the whole
    machine). So M works when every resource has M among its preferred hints or a preferred hint
    without nodes; empty merges do not count.
    """
    constrained = [masks for masks, has_none in sides if not has_none]
    if constrained:
        shared = set.intersection(*constrained)
    else:
        shared = set().union(*(masks for masks, _ in sides))
    candidates = {m & default_mask for m in shared}
    if not constrained:
        candidates.add(default_mask)
    candidates.discard(0)
    if within is not None:
        candidates = {m for m in candidates if not m & ~within}
    return min(candidates, key=fitter) if candidates else None


def _best_non_preferred(reaches: list[_Reach], universe: _Universe,
                        fitter: FitterKey, within: int | None = None) -> int | None:
    """The mask the kubelet keeps when no merged hint is preferred (None: every merge was empty).

    The kubelet ranks non-preferred masks by their node count against ``target`` (the most nodes
    any resource needs at least): exactly ``target`` first, then fewer nodes (more is better), then
    more nodes (fewer is better); within a count by the fitter order.
    """
    target = max((count for _, count in reaches if count is not None), default=0)
    reach = nonzero_intersections([restrictions for restrictions, _ in reaches], universe.width)
    if within is not None:  # the target stays the one every slot sets: the kubelet's ranking
        packed = universe.pack(within)
        reach = {m for m in reach if not m & ~packed}
    if not reach:
        return None

    def rank(count: int) -> int:
        if count == target:
            return 0
        return target - count if count < target else count

    best_count = min(set(map(int.bit_count, reach)), key=rank)
    tier = [m for m in reach if m.bit_count() == best_count]
    return min(map(universe.unpack, tier), key=fitter)


def _slot(index: int, resource: object, hints: object) -> Slot:
    """``providers_hints[index][resource]`` as a slot (the place is only spelled out for an
    error: formatting it for every slot was a share of a small merge)."""
    if hints is None:
        return _NO_PREFERENCE
    if not _is_list(hints):
        raise MergeError(f"providers_hints[{index}][{resource!r}]: expected a list of Hint or "
                         f"None, got {hints!r}")
    if not hints:
        return _NO_NODE_FITS
    slot = tuple(hints)
    if set(map(type, slot)) != {Hint}:  # the quick check, in C; subclasses are fine too
        for position, hint in enumerate(slot):
            if not isinstance(hint, Hint):
                raise MergeError(f"providers_hints[{index}][{resource!r}][{position}]: expected "
                                 f"a Hint, got {hint!r}")
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
