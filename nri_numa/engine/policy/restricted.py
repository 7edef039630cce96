"""Policy ``restricted``: best-effort's merge, but only a preferred hint is admitted.

A rejection is the kubelet's TopologyAffinityError ("Resources cannot be allocated with Topology
locality").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nri_numa.engine.hints import Hint, MergeFn, Slot


@dataclass(frozen=True, slots=True)
class RestrictedPolicy:
    name: str = "restricted"

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]:
        best = merge(slots, True)
        return best, best.preferred
