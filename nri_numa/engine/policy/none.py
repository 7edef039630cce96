"""Policy ``none``: no alignment. Admits everything with the empty hint, without merging."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nri_numa.engine.hints import Hint, MergeFn, Slot


@dataclass(frozen=True, slots=True)
class NonePolicy:
    name: str = "none"

    def decide(self, slots: Sequence[Slot], merge: MergeFn,
               default_affinity: frozenset[int]) -> tuple[Hint, bool]:
        return Hint(None, False), True
