"""Policy ``single-numa-node``: everything on one NUMA node, or the pod is not admitted.

Before merging, each resource keeps only its preferred hints that name no node (no preference)
or exactly one node; a resource left with nothing makes the whole merge fail. prefer-closest is
ignored (all candidates are single nodes). A merged hint covering the whole machine only arises
from "no preference" everywhere and is reported without an affinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nri_numa.engine.hints import Hint, MergeFn, Slot


def filter_single_numa_hints(slots: Sequence[Slot]) -> list[Slot]:
    return [tuple(h for h in slot if h.preferred and (h.mask is None or h.mask.bit_count() == 1))
            for slot in slots]


@dataclass(frozen=True, slots=True)
class SingleNumaNodePolicy:
    name: str = "single-numa-node"

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]:
        best = merge(filter_single_numa_hints(slots), False)
        if best.affinity == default_affinity:
            best = Hint(None, best.preferred)
        return best, best.preferred
