"""A topology hint: the NUMA nodes a resource could use, and whether that is a preferred fit.

``affinity`` is ``None`` when the hint says nothing about NUMA nodes (the kubelet's nil mask),
which is different from ``frozenset()`` (a mask with no node in it). Two hints are equal when
both the flag and the affinity are (``None`` equals only ``None``): the kubelet's IsEqual. The
``mask`` view is the affinity as an int (see ``bitmask``), computed once.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nri_numa.engine.bitmask import bits, mask_of


class MergeError(ValueError):
    """Input the merge cannot use; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Hint:
    affinity: frozenset[int] | None
    preferred: bool
    mask: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        affinity = self.affinity
        if not isinstance(self.preferred, bool):
            raise MergeError(f"Hint.preferred must be a bool, got {self.preferred!r}")
        if affinity is None:
            mask = None
        else:
            if isinstance(affinity, (str, bytes)):
                raise MergeError(f"Hint.affinity must be NUMA node ids or None, got {affinity!r}")
            affinity = frozenset(affinity)
            try:
                mask = mask_of(affinity)
            except ValueError as err:
                raise MergeError(f"Hint.affinity: {err}") from None
            object.__setattr__(self, "affinity", affinity)
        object.__setattr__(self, "mask", mask)


# One resource's hints as the merge sees them (the kubelet's filterProvidersHints output row).
Slot = tuple[Hint, ...]
# The merge a policy runs: the slots, and whether prefer-closest-numa-nodes may apply.
MergeFn = Callable[[Sequence[Slot], bool], Hint]


class _HintTable(dict[int, Hint]):
    """The hints of one ``preferred`` flag by mask, each made the first time it is asked for.

    Hints are immutable and the providers hand out the same few on every admission, so one
    value per mask is shared. Bounded: once ``_TABLE_LIMIT`` masks are kept (lists of every
    mask of many nodes), further hints are made afresh each time rather than kept.
    """

    def __init__(self, preferred: bool) -> None:
        super().__init__()
        self.preferred = preferred

    def __missing__(self, mask: int) -> Hint:
        hint = Hint(bits(mask), self.preferred)
        if len(self) < _TABLE_LIMIT:
            self[mask] = hint
        return hint


_TABLE_LIMIT = 1 << 13  # per flag: every mask of 13 nodes, a few MB of hints at most
_NOT_PREFERRED, _PREFERRED = _HintTable(False), _HintTable(True)


def hint_of_mask(mask: int, preferred: bool) -> Hint:
    """The hint on the nodes of ``mask`` (a non-negative int)."""
    return (_PREFERRED if preferred else _NOT_PREFERRED)[mask]


def hints_of_masks(masks: Sequence[int], preferred_size: int) -> list[Hint]:
    """``hint_of_mask`` for each mask, preferred where it has ``preferred_size`` nodes: the rule
    the providers' hints follow. ``masks`` come fewest nodes first, as in kubelet order, so the
    preferred ones are one run: found by bisection, each run is then looked up in C."""
    start = bisect_left(masks, preferred_size, key=int.bit_count)
    end = bisect_right(masks, preferred_size, lo=start, key=int.bit_count)
    hints = list(map(_NOT_PREFERRED.__getitem__, masks[:start]))
    hints += map(_PREFERRED.__getitem__, masks[start:end])
    hints += map(_NOT_PREFERRED.__getitem__, masks[end:])
    return hints
