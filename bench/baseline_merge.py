"""The reference merge: the kubelet's Topology Manager merge, transcribed step by step.

Every combination of one hint per resource is visited by the kubelet's recursive odometer (first
resource outermost, each resource's hints in list order), merged, and compared with the best so
far by the HintMerger's ``compare``. Its cost is the product of the hint list lengths, which is
why the kubelet refuses machines with more than 8 NUMA nodes; it is here to check the engine's
merge against (tests/property/test_merge_equivalence.py) and to time it against (bench_merge.py).

It shares nothing with ``nri_numa.engine.merge`` but the ``Hint`` type and the option parser:
masks, counts, distances and the comparison are written out again here, after the Go source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nri_numa.engine.hints import Hint, MergeError
from nri_numa.engine.policy.options import go_quote, parse_policy_options

# A hint inside the baseline: (mask or None, preferred), masks as ints, bit i = node id i.
RawHint = tuple[int | None, bool]

POLICY_NAMES = ("none", "best-effort", "restricted", "single-numa-node")


def baseline_merge(policy: str, numa_nodes: Sequence[int],
                   providers_hints: Sequence[Mapping[str, Sequence[Hint] | None] | None], *,
                   distances: Sequence[Sequence[int]] | None = None,
                   options: Mapping[str, str] | None = None) -> tuple[Hint, bool]:
    """Same contract as ``nri_numa.engine.merge_hints``; cost = product of the hint list lengths."""
    opts = parse_policy_options(options)
    if opts.prefer_closest_numa_nodes and distances is None:
        raise MergeError("prefer-closest-numa-nodes needs NUMA distances")
    nodes = list(numa_nodes)
    if policy != "none" and len(nodes) > opts.max_allowable_numa_nodes:
        raise MergeError(f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes")
    if policy not in POLICY_NAMES:
        raise MergeError(f"unknown policy: {go_quote(policy)}")
    if policy == "none":
        return Hint(None, False), True
    hints = filter_providers_hints(providers_hints)
    if policy == "single-numa-node":
        hints = filter_single_numa_hints(hints)
    closest = opts.prefer_closest_numa_nodes and policy != "single-numa-node"
    merger = _HintMerger(nodes, distances if closest else None, hints)
    mask, preferred = merger.merge()
    default = _mask(nodes)
    if policy == "single-numa-node" and mask == default:
        return Hint(None, preferred), preferred
    merged = Hint(_bits(mask), preferred)
    return merged, (True if policy == "best-effort" else preferred)


def filter_providers_hints(providers_hints: Sequence[Mapping[str, Sequence[Hint] | None] | None]
                           ) -> list[list[RawHint]]:
    all_hints: list[list[RawHint]] = []
    for hints in providers_hints:
        if not hints:  # nil or empty map: no preference at all
            all_hints.append([(None, True)])
            continue
        for resource in hints:
            if hints[resource] is None:
                all_hints.append([(None, True)])
                continue
            if len(hints[resource]) == 0:
                all_hints.append([(None, False)])
                continue
            all_hints.append([(_hint_mask(h), h.preferred) for h in hints[resource]])
    return all_hints


def filter_single_numa_hints(all_hints: list[list[RawHint]]) -> list[list[RawHint]]:
    filtered_all = []
    for one_resource in all_hints:
        filtered = []
        for mask, preferred in one_resource:
            if mask is None and preferred:
                filtered.append((mask, preferred))
            if mask is not None and _count(mask) == 1 and preferred:
                filtered.append((mask, preferred))
        filtered_all.append(filtered)
    return filtered_all


def iterate_all_provider_topology_hints(all_hints: list[list[RawHint]],
                                        callback: Callable[[list[RawHint]], None]) -> None:
    def iterate(i: int, accum: list[RawHint]) -> None:
        if i == len(all_hints):
            callback(accum)
            return
        for hint in all_hints[i]:
            iterate(i + 1, accum + [hint])

    iterate(0, [])


def merge_permutation(default_affinity: int, permutation: list[RawHint]) -> RawHint:
    preferred = True
    affinities: list[int] = []
    for mask, hint_preferred in permutation:
        if mask is not None:
            affinities.append(mask)
            if mask != affinities[0]:
                preferred = False
        if not hint_preferred:
            preferred = False
    merged = default_affinity
    for mask in affinities:
        merged &= mask
    return merged, preferred


def max_of_min_affinity_counts(all_hints: list[list[RawHint]]) -> int:
    best = 0
    for resource_hints in all_hints:
        narrowest = None
        for mask, _ in resource_hints:
            if mask is None:
                continue
            if narrowest is None or _is_narrower(mask, narrowest):
                narrowest = mask
        if narrowest is not None and _count(narrowest) > best:
            best = _count(narrowest)
    return best


@dataclass
class _HintMerger:
    nodes: list[int]
    distances: Sequence[Sequence[int]] | None  # only when prefer-closest applies
    hints: list[list[RawHint]]

    def __post_init__(self) -> None:
        self.best_non_preferred_affinity_count = max_of_min_affinity_counts(self.hints)
        self.row = {node: i for i, node in enumerate(self.nodes)}

    def merge(self) -> tuple[int, bool]:
        default_affinity = _mask(self.nodes)
        best: list[RawHint | None] = [None]

        def visit(permutation: list[RawHint]) -> None:
            best[0] = self.compare(best[0], merge_permutation(default_affinity, permutation))

        iterate_all_provider_topology_hints(self.hints, visit)
        if best[0] is None:
            return default_affinity, False
        return best[0]  # type: ignore[return-value]

    def compare(self, current: RawHint | None, candidate: RawHint) -> RawHint | None:
        cand_mask, cand_pref = candidate
        if _count(cand_mask) == 0:  # type: ignore[arg-type]
            return current
        if current is None:
            return candidate
        cur_mask, cur_pref = current
        if not cur_pref and cand_pref:
            return candidate
        if cur_pref and not cand_pref:
            return current
        if cur_pref and cand_pref:
            return self.fitter(current, candidate)
        target = self.best_non_preferred_affinity_count
        c, k = _count(cur_mask), _count(cand_mask)  # type: ignore[arg-type]
        if c > target:
            return self.fitter(current, candidate)
        if c == target:
            if k != target:
                return current
            return self.fitter(current, candidate)
        if k > target:
            return current
        if k == target:
            return candidate
        if k > c:
            return candidate
        if k < c:
            return current
        return self.fitter(current, candidate)

    def fitter(self, current: RawHint, candidate: RawHint) -> RawHint:
        if candidate[0] == current[0]:
            return current
        if self.distances is not None:
            best = self.closest(current[0], candidate[0])  # type: ignore[arg-type]
        else:
            best = _narrowest(current[0], candidate[0])  # type: ignore[arg-type]
        return current if best == current[0] else candidate

    def closest(self, m1: int, m2: int) -> int:
        if _count(m1) != _count(m2):
            return _narrowest(m1, m2)
        d1, d2 = self.average_for(m1), self.average_for(m2)
        if d1 == d2:
            return m1 if m1 < m2 else m2
        return m1 if d1 < d2 else m2

    def average_for(self, mask: int) -> float:
        if _count(mask) == 0:
            return 0.0
        count = 0.0
        total = 0.0
        for node1 in _bits(mask):
            for node2 in _bits(mask):
                total += float(self.distances[self.row[node1]][self.row[node2]])  # type: ignore[index]
                count += 1
        return total / count


def _hint_mask(hint: Hint) -> int | None:
    if hint.affinity is None:
        return None
    return _mask(hint.affinity)


def _mask(ids: Iterable[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask


def _bits(mask: int) -> frozenset[int]:
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def _count(mask: int) -> int:
    return bin(mask).count("1")


def _is_narrower(a: int, b: int) -> bool:
    if _count(a) == _count(b):
        return a < b
    return _count(a) < _count(b)


def _narrowest(m1: int, m2: int) -> int:
    return m1 if _is_narrower(m1, m2) else m2
