"""``nri-numa explain``: one pod's admission, merge by merge, and why the winning hint won.

The engine's merge (``engine.merge``) finds the kubelet's answer as the minimum of one total
order over merged hints (docs/merge-algorithm.md). To say *why* it won, this module ranks the
same candidates by the same order and compares the winner with the runner-up: the first rule
of the order on which they differ is the rule that decided. The ranking is rebuilt from the
public pieces (``provider_slots``, ``filter_single_numa_hints``, ``NumaInfo``,
``nonzero_intersections``) rather than read out of the merge, which stays as fast as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from nri_numa.engine.admit import Admission, admit
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.bitmask import bits, nonzero_intersections
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint, Slot
from nri_numa.engine.merge import ProviderHints, provider_slots
from nri_numa.engine.numa_info import NumaInfo
from nri_numa.engine.policy.single_numa_node import filter_single_numa_hints
from nri_numa.engine.scope import MergeStep
from nri_numa.safeio.bounds import clip
from nri_numa.views.simulate import Entry, InputError, PodEntry, Simulator, Step, StepKind, known_pods

SINGLE_NUMA_NODE = "single-numa-node"
MAX_NAMED = 20  # pods an unknown --pod's error lists; a file of thousands stays one line


class Rule(StrEnum):
    """What decided between the winner and the runner-up (or why there was no contest)."""

    NO_ALIGNMENT = "no-alignment"  # policy none: nothing is merged
    MISSING_HINTS = "missing-hints"  # a resource has no hint: no combination exists
    NO_PREFERENCE = "no-preference"  # no hint names nodes: the whole machine
    NO_COMMON_NODE = "no-common-node"  # every combination merges to no node
    ONLY_CANDIDATE = "only-candidate"
    PREFERRED = "preferred-beats-non-preferred"
    NARROWEST = "narrowest"
    CLOSEST = "closest"
    LOWER_MASK = "lower-mask"
    NODE_COUNT_TIER = "non-preferred-node-count"  # the kubelet's bestNonPreferredAffinityCount


@dataclass(frozen=True, slots=True)
class Verdict:
    winner: Hint  # what the merge returns (single-numa-node later reports the whole machine as any)
    runner_up: Hint | None
    rule: Rule
    reason: str  # the rule in words, with the figures that decided


@dataclass(frozen=True, slots=True)
class LabeledSlot:
    provider: str
    resource: str | None  # None: the provider had no preference at all
    hints: Slot

    @property
    def label(self) -> str:
        return f"{self.provider} (no preference)" if self.resource is None else self.resource


def labeled_slots(hints: Sequence[tuple[str, ProviderHints]]) -> list[LabeledSlot]:
    """The merge's slots (one per resource, as ``provider_slots`` builds them), with names."""
    out = []
    for provider, by_resource in hints:
        slots = provider_slots([by_resource])
        resources: Sequence[str | None] = list(by_resource) if by_resource else [None]
        out += [LabeledSlot(provider, r, s) for r, s in zip(resources, slots)]
    return out


# --- why the winner won -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ranking:
    """Every distinct merged mask, best first, under the kubelet's comparison."""

    ordered: list[tuple[int, bool]]  # (mask, preferred)
    target: int  # the node count non-preferred masks are ranked against
    info: NumaInfo
    closest: bool  # prefer-closest-numa-nodes applies to this merge

    def average(self, mask: int) -> float:
        return self.info.average_distance(mask)

    def lower_but_farther(self, winner: int, preferred: bool) -> int | None:
        """The lowest mask as wide as ``winner``, in its class, that lost only on distance."""
        lower = [m for m, p in self.ordered
                 if p == preferred and m < winner and m.bit_count() == winner.bit_count()]
        return min(lower, default=None)


def explain_merge(policy: str, numa_ids: Sequence[int], slots: Sequence[LabeledSlot], *,
                  distances: Sequence[Sequence[int]] | None = None,
                  prefer_closest: bool = False) -> Verdict:
    """Why ``policy``'s merge of ``slots`` gives the hint it gives; ``distances`` indexed like
    ``numa_ids``, read only with ``prefer_closest``."""
    if policy == "none":
        return Verdict(Hint(None, False), None, Rule.NO_ALIGNMENT,
                       "policy none does not align: every container is admitted with no NUMA affinity")
    single = policy == SINGLE_NUMA_NODE
    kept = filter_single_numa_hints([s.hints for s in slots]) if single else [s.hints for s in slots]
    info = NumaInfo(tuple(numa_ids), tuple(map(tuple, distances)) if prefer_closest and distances else None)
    whole = Hint(bits(info.default_mask), False)
    # A lone "no node, not preferred" hint is how a provider says nothing on this machine fits.
    unfit = {s.label for s in slots if all(h.mask is None and not h.preferred for h in s.hints)}
    note = "".join(f"{label}: no NUMA node can hold it; " for label in sorted(unfit))
    empty = [s.label for s, hints in zip(slots, kept) if not hints]
    if empty:
        return _missing_hints(empty, unfit, whole)
    ranking = _rank(kept, info, prefer_closest and not single)
    if not ranking.ordered:
        return Verdict(whole, None, Rule.NO_COMMON_NODE,
                       f"{note}every combination of hints has no NUMA node in common, so the "
                       "result is the whole machine, not preferred")
    (w, w_pref) = ranking.ordered[0]
    runner = ranking.ordered[1] if len(ranking.ordered) > 1 else None
    winner = Hint(bits(w), w_pref)
    if w_pref and all(h.mask is None for hints in kept for h in hints):
        return Verdict(winner, None, Rule.NO_PREFERENCE,
                       "no resource asks for particular NUMA nodes, so the result is the whole "
                       "machine, preferred")
    if runner is None:
        only = "preferred" if w_pref else "not preferred"
        return Verdict(winner, None, Rule.ONLY_CANDIDATE,
                       f"{note}{_mask(w)} is the only set of NUMA nodes any combination of hints "
                       f"merges to ({only})")
    r, r_pref = runner
    rule, reason = _decide(ranking, w, w_pref, r, r_pref)
    if single:
        reason = "single-numa-node keeps only preferred one-node hints; " + reason
    return Verdict(winner, Hint(bits(r), r_pref), rule, note + reason)


def _missing_hints(empty: list[str], unfit: set[str], whole: Hint) -> Verdict:
    # Only single-numa-node's filter empties a slot; provider_slots never gives one.
    causes = "; ".join(f"{label}: " + ("no NUMA node can hold it" if label in unfit else
                                       "single-numa-node drops all its hints (not preferred, or "
                                       "on more than one node)") for label in empty)
    return Verdict(whole, None, Rule.MISSING_HINTS,
                   f"{causes}, so no combination of hints exists and the result is the whole "
                   "machine, not preferred")


def _rank(slots: Sequence[Slot], info: NumaInfo, closest: bool) -> _Ranking:
    fit = info.fitter_key(closest)
    whole = info.default_mask
    preferred = _preferred_masks(slots, whole)
    target = max((min(h.mask.bit_count() for h in s if h.mask is not None)
                  for s in slots if any(h.mask is not None for h in s)), default=0)

    def tier(count: int) -> int:
        return 0 if count == target else target - count if count < target else count

    others = _reachable(slots, info.nodes) - preferred
    ordered = [(m, True) for m in sorted(preferred, key=fit)]
    ordered += [(m, False) for m in sorted(others, key=lambda m: (tier(m.bit_count()), fit(m)))]
    return _Ranking(ordered, target, info, closest)


def _preferred_masks(slots: Sequence[Slot], whole: int) -> set[int]:
    """Masks of preferred merges: all hints preferred and every mask they name the same."""
    named = [{h.mask for h in s if h.preferred and h.mask is not None} for s in slots]
    has_any = [any(h.preferred and h.mask is None for h in s) for s in slots]
    constrained = [m for m, any_ok in zip(named, has_any) if not any_ok]
    if constrained:
        masks = set.intersection(*constrained)
    else:  # a preferred no-preference hint everywhere: one slot may name nodes, or none
        masks = set().union(*named) | {whole}
    return {m & whole for m in masks} - {0}


def _reachable(slots: Sequence[Slot], nodes: Sequence[int]) -> set[int]:
    """Every non-empty mask some combination of hints merges to, preferred or not."""
    position = {node: i for i, node in enumerate(sorted(nodes))}

    def pack(mask: int | None) -> int:
        if mask is None:
            return (1 << len(position)) - 1
        return sum(1 << position[n] for n in bits(mask) if n in position)

    reach = nonzero_intersections([{pack(h.mask) for h in s} for s in slots], len(position))
    ids = sorted(nodes)
    return {sum(1 << ids[p] for p in bits(m)) for m in reach}


def _decide(ranking: _Ranking, w: int, w_pref: bool, r: int, r_pref: bool) -> tuple[Rule, str]:
    if w_pref and not r_pref:
        return Rule.PREFERRED, (
            f"{_mask(w)} is preferred (every resource has a preferred hint on exactly these "
            "nodes, or no preference); the best merge "
            f"that is not, {_mask(r)}, loses because a preferred hint beats any non-preferred one")
    if w_pref:
        return _by_fit(ranking, w, True, r, "among preferred hints")
    cw, cr, target = w.bit_count(), r.bit_count(), ranking.target
    intro = ("no combination of preferred hints agrees on one set of NUMA nodes, so the result is "
             f"not preferred; non-preferred merges are ranked by node count against {target} (the "
             "widest of the resources' narrowest hints): exactly that many first, then fewer "
             "(more is better), then more (fewer is better)")
    if cw == cr:
        rule, words = _by_fit(ranking, w, False, r, "among non-preferred merges")
        return rule, f"{intro}; {words}"
    return Rule.NODE_COUNT_TIER, (f"{intro}; {_mask(w)} has {_tier_words(cw, target)}, "
                                  f"{_mask(r)} has {_tier_words(cr, target)}")


def _tier_words(count: int, target: int) -> str:
    if count == target:
        return f"exactly {_nodes(count)}"
    return f"{_nodes(count)}, {'fewer' if count < target else 'more'} than {target}"


def _by_fit(ranking: _Ranking, w: int, w_pref: bool, r: int, among: str) -> tuple[Rule, str]:
    cw, cr = w.bit_count(), r.bit_count()
    if cw != cr:
        return Rule.NARROWEST, (f"{among}, the narrowest wins: {_mask(w)} spans {_nodes(cw)}, "
                                f"{_mask(r)} spans {_nodes(cr)}")
    if not ranking.closest:
        return Rule.LOWER_MASK, (f"{among}, {_mask(w)} and {_mask(r)} both span {_nodes(cw)}; the "
                                 "lower mask (the lower node ids) wins the tie")
    dw, dr = ranking.average(w), ranking.average(r)
    if dw != dr:
        return Rule.CLOSEST, (f"{among}, {_mask(w)} and {_mask(r)} both span {_nodes(cw)}; with "
                              "prefer-closest-numa-nodes "
                              f"the smaller average distance wins: {_mask(w)} {dw:g}, "
                              f"{_mask(r)} {dr:g}")
    words = (f"{among}, {_mask(w)} and {_mask(r)} are equally close (average distance {dw:g}) "
             f"and both span {_nodes(cw)}; the lower mask (the lower node ids) wins the tie")
    farther = ranking.lower_but_farther(w, w_pref)
    if farther is not None:
        words += (f"; {_mask(farther)} is lower still but farther (average distance "
                  f"{ranking.average(farther):g}), and prefer-closest-numa-nodes ranks distance "
                  "before the mask")
    return Rule.LOWER_MASK, words


def _mask(mask: int) -> str:
    return "{" + ",".join(map(str, bits(mask))) + "}"


def _nodes(count: int) -> str:
    return f"{count} node" + ("" if count == 1 else "s")


# --- one pod, against the state the pods before it leave --------------------------------


@dataclass(frozen=True, slots=True)
class MergeExplanation:
    step: MergeStep
    slots: tuple[LabeledSlot, ...]
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Explanation:
    entry: PodEntry
    admission: Admission
    merges: tuple[MergeExplanation, ...]
    before: tuple[Step, ...]  # what the entries before it did
    state: Allocations  # the ledger the pod was admitted against

    @property
    def errors(self) -> tuple[Step, ...]:
        return tuple(s for s in self.before if s.kind is StepKind.ERROR)


def explain_pod(ctx: EngineContext, entries: Sequence[Entry], key: str,
                source: str = "the pods file") -> Explanation:
    """The first pod named ``key`` (namespace/name), admitted against the state the entries
    before it leave; nothing is committed. InputError when no such pod is in ``entries``."""
    index = next((i for i, e in enumerate(entries) if isinstance(e, PodEntry) and e.key == key), None)
    if index is None:
        pods = known_pods(entries)
        names = ", ".join(clip(name) for name in pods[:MAX_NAMED]) or "none"
        if len(pods) > MAX_NAMED:
            names += f", and {len(pods) - MAX_NAMED} more"
        raise InputError(f"no pod {clip(key)} in {source} (pods: {names})")
    simulator = Simulator(ctx)
    for entry in entries[:index]:
        simulator.apply(entry)
    target = entries[index]
    assert isinstance(target, PodEntry)  # found above
    admission = admit(ctx, simulator.ledger.allocations, target.pod)
    merges = tuple(_explain_step(ctx, admission.decision.policy, s) for s in admission.steps)
    return Explanation(target, admission, merges, tuple(simulator.steps),
                       simulator.ledger.allocations)


def _explain_step(ctx: EngineContext, policy: str, step: MergeStep) -> MergeExplanation:
    slots = tuple(labeled_slots(step.hints))
    verdict = explain_merge(policy, ctx.numa_ids, slots, distances=ctx.distances,
                            prefer_closest=ctx.config.prefer_closest_numa_nodes)
    return MergeExplanation(step, slots, verdict)

