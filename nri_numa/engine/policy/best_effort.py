"""Policy ``best-effort``: the merged hint, whatever it is; every pod is admitted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nri_numa.engine.hints import Hint, MergeFn, Slot


@dataclass(frozen=True, slots=True)
class BestEffortPolicy:
    name: str = "best-effort"

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]:
        return merge(slots, True), True
