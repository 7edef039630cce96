"""A topology hint: the NUMA nodes a resource could use, and whether that is a preferred fit.

``affinity`` is ``None`` when the hint says nothing about NUMA nodes (the kubelet's nil mask),
which is different from ``frozenset()`` (a mask with no node in it). Two hints are equal when
both the flag and the affinity are (``None`` equals only ``None``): the kubelet's IsEqual. The
``mask`` view is the affinity as an int (see ``bitmask``), computed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from nri_numa.engine.bitmask import is_narrower, mask_of


class MergeError(ValueError):
    """Input the merge cannot use; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Hint:
    affinity: frozenset[int] | None
    preferred: bool
    mask: int | None = field(init=False, repr=False, compare=False)

    def __init__(self, affinity: Iterable[int] | None, preferred: bool) -> None:
        if not isinstance(preferred, bool):
            raise MergeError(f"Hint.preferred must be a bool, got {preferred!r}")
        if affinity is None:
            nodes, mask = None, None
        else:
            if isinstance(affinity, (str, bytes)):
                raise MergeError(f"Hint.affinity must be NUMA node ids or None, got {affinity!r}")
            nodes = frozenset(affinity)
            try:
                mask = mask_of(nodes)
            except ValueError as err:
                raise MergeError(f"Hint.affinity: {err}") from None
        object.__setattr__(self, "affinity", nodes)
        object.__setattr__(self, "preferred", preferred)
        object.__setattr__(self, "mask", mask)

    def less_than(self, other: Hint) -> bool:
        """The kubelet's LessThan, used to sort hint lists: preferred first, then narrower.

        Like the kubelet's, it needs both affinities set when the flags agree.
        """
        if self.preferred != other.preferred:
            return self.preferred
        if self.mask is None or other.mask is None:
            raise MergeError("Hint.less_than compares affinities; one of them is None")
        return is_narrower(self.mask, other.mask)


# One resource's hints as the merge sees them (the kubelet's filterProvidersHints output row).
Slot = tuple[Hint, ...]
# The merge a policy runs: the slots, and whether prefer-closest-numa-nodes may apply.
MergeFn = Callable[[Sequence[Slot], bool], Hint]
