"""The machine's NUMA nodes and distances, and the kubelet's two ways of picking the fitter mask.

* ``narrowest(m1, m2)``: ``m1`` if it is narrower (fewer nodes, then smaller integer), else ``m2``.
* ``closest(m1, m2)``: with different node counts the narrowest; otherwise the smaller average
  distance; equal averages fall back to the smaller integer.
* ``average_distance(mask)``: the mean of ``distance[i][j]`` over all ordered pairs of nodes in
  the mask, ``i == j`` included (``{0, 2}`` on the usual 4-node table = (10+12+12+10)/4 = 11).

``distances`` is a square table indexed like ``nodes`` (row k is node ``nodes[k]``), used exactly
as stored: tables need not be symmetric. Both choices are total orders on masks, and
``fitter_key`` gives the sort key that realises them (the smallest key is the fittest mask).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nri_numa.engine.bitmask import bits, is_narrower, mask_of
from nri_numa.engine.hints import MergeError

FitterKey = Callable[[int], tuple]


@dataclass(frozen=True, slots=True)
class NumaInfo:
    nodes: tuple[int, ...]
    distances: tuple[tuple[int, ...], ...] | None = None
    default_mask: int = field(init=False)
    _row_of: dict[int, int] = field(init=False, repr=False, compare=False)
    _averages: dict[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        try:
            default_mask = mask_of(nodes)
        except ValueError as err:
            raise MergeError(f"numa_nodes: {err}") from None
        if len(set(nodes)) != len(nodes):
            raise MergeError(f"numa_nodes: duplicate NUMA node ids in {list(nodes)}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "default_mask", default_mask)
        if self.distances is not None:
            object.__setattr__(self, "distances", _checked_table(self.distances, len(nodes)))
        object.__setattr__(self, "_row_of", {node: row for row, node in enumerate(nodes)})
        object.__setattr__(self, "_averages", {})

    def narrowest(self, m1: int, m2: int) -> int:
        return m1 if is_narrower(m1, m2) else m2

    def closest(self, m1: int, m2: int) -> int:
        if m1.bit_count() != m2.bit_count():
            return self.narrowest(m1, m2)
        d1, d2 = self.average_distance(m1), self.average_distance(m2)
        if d1 == d2:
            return m1 if m1 < m2 else m2
        return m1 if d1 < d2 else m2

    def average_distance(self, mask: int) -> float:
        cached = self._averages.get(mask)
        if cached is not None:
            return cached
        if self.distances is None:
            raise MergeError("NUMA distances are needed to compare average distances, none were given")
        rows = [self._row(node) for node in bits(mask)]
        if not rows:
            return 0.0
        pick = operator.itemgetter(*rows)
        if len(rows) == 1:
            total = pick(self.distances[rows[0]])
        else:
            total = sum(map(sum, map(pick, map(self.distances.__getitem__, rows))))
        # Integer sum then one division: the same float the kubelet's running float64 sum gives,
        # as long as the sum stays below 2**53.
        average = total / (len(rows) * len(rows))
        self._averages[mask] = average
        return average

    def fitter_key(self, prefer_closest: bool) -> FitterKey:
        """Sort key of ``closest`` (``prefer_closest``) or ``narrowest``: the minimum wins."""
        if prefer_closest:
            return lambda m: (m.bit_count(), self.average_distance(m), m)
        return lambda m: (m.bit_count(), m)

    def _row(self, node: int) -> int:
        row = self._row_of.get(node)
        if row is None:
            raise MergeError(f"NUMA node {node} is not one of the machine's nodes {list(self.nodes)}")
        return row


def _checked_table(table: Sequence[Sequence[int]], size: int) -> tuple[tuple[int, ...], ...]:
    if not isinstance(table, Sequence) or isinstance(table, (str, bytes)) or len(table) != size:
        raise MergeError(f"distances: expected {size} rows (one per NUMA node), got {_length(table)}")
    rows = []
    for r, row in enumerate(table):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != size:
            raise MergeError(f"distances[{r}]: expected {size} values, got {row!r}")
        row = tuple(row)
        # The quick check first (set/min run in C); tables are n*n and checked on every merge.
        if set(map(type, row)) - {int} or (row and min(row) < 0):
            c, value = next((c, v) for c, v in enumerate(row)
                            if not isinstance(v, int) or isinstance(v, bool) or v < 0)
            raise MergeError(f"distances[{r}][{c}]: expected a non-negative integer, got {value!r}")
        rows.append(row)
    return tuple(rows)


def _length(value: object) -> str:
    try:
        return str(len(value))  # type: ignore[arg-type]
    except TypeError:
        return repr(value)
