"""takeByTopologyNUMADistributed (§4.8 of docs/kubelet-algorithms.md, KEP-2902).

For k = the fewest NUMA nodes that could hold the request, then k+1, ...: look at every k-subset
of the NUMA nodes with free CPUs (in the accumulator's NUMA order) that can give each member an
even share ``d`` (a multiple of the group size) and hand the remainder out group by group to
some of its members. Score each way by the *balance*: the standard deviation of the free CPUs of
every node afterwards, rounded to three decimals as the kubelet does (its fix for float noise
between equal scores). Keep the first best; a balance of 0 ends the search. Then take ``d`` CPUs
from each member and the remainder, one group at a time, with the packed algorithm inside each
node. No k works → the packed algorithm over everything.

Where this differs from the Go code, on purpose:

* The Go combination iterator hands out slices that share memory; a remembered best combination
  (or remainder subset) of four or more nodes can be overwritten by later ones before it is
  used. Here the combination that scored best is the one used.
* The Go remainder loop spins forever when a subset holds enough CPUs but not enough whole
  groups; such a subset is skipped here.
* The Go search visits C(nodes, k) subsets, each with up to 2^k remainder subsets, each scored
  over all nodes. Where that exceeds ``SEARCH_BUDGET`` (never on 8 NUMA nodes or fewer; past
  that, for requests spanning several nodes) the best way is computed directly instead: the k
  nodes with the most free CPUs, remainder groups to those with the most left. That is the
  optimum of the same score, equal scores going to the earliest nodes in NUMA order as in the
  search; it can differ from the search only where two scores differ by less than the 0.001
  rounding step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import combinations

from nri_numa.engine.cpu.accumulator import CPUAccumulator, CPUAllocationError, new_accumulator
from nri_numa.engine.cpu.packed import take_packed
from nri_numa.engine.cpu.topology import CPUTopology

# Work allowed for one k: combinations x remainder subsets x nodes scored. Every k on 8 NUMA
# nodes (the kubelet's limit) fits: at most 16,384 at k = 5 or 6.
SEARCH_BUDGET = 16_384

Counts = dict[int, int]  # NUMA node → free CPUs


def take_distributed(topology: CPUTopology, free: int, count: int, group: int,
                     strategy: str) -> int:
    """The chosen CPUs as a bit mask."""
    if count % group:
        return take_packed(topology, free, count, strategy)
    acc = new_accumulator(topology, free, count)
    if acc is None:
        return 0
    numas = acc.numa_order()
    free_per_node = {n: acc.free_in(topology.numa_cpus[n]) for n in numas}
    low, high = _node_count_range(topology, len(numas), count, group)
    for k in range(low, high + 1):
        plan = _best_plan(numas, free_per_node, k, count, group)
        if plan is None:
            continue
        members, remainder_nodes = plan
        share = count // k // group * group
        for n in members:
            acc.take(take_packed(topology, acc.free & topology.numa_cpus[n], share, strategy))
        _take_remainder(acc, topology, remainder_nodes, count - share * k, group, strategy)
        if acc.needed > 0:
            raise CPUAllocationError(
                f"accounting error, not enough CPUs allocated, remaining: {acc.needed}")
        if acc.needed < 0:
            raise CPUAllocationError(
                f"accounting error, too many CPUs allocated, remaining: {acc.needed}")
        return acc.result
    return take_packed(topology, free, count, strategy)


def _node_count_range(topology: CPUTopology, nodes_with_free: int, count: int,
                      group: int) -> tuple[int, int]:
    """rangeNUMANodesNeededToSatisfy: the machine's groups per node bound k from below."""
    groups = -(-topology.num_cpus // group)
    groups_per_node = -(-groups // topology.num_numa_nodes)
    groups_needed = -(-count // group)
    return -(-groups_needed // groups_per_node), min(groups_needed, nodes_with_free)


def _take_remainder(acc: CPUAccumulator, topology: CPUTopology, nodes: Sequence[int],
                    remainder: int, group: int, strategy: str) -> None:
    while remainder > 0:
        progressed = False
        for n in nodes:
            if remainder == 0:
                break
            node_free = acc.free & topology.numa_cpus[n]
            if node_free.bit_count() < group:
                continue
            acc.take(take_packed(topology, node_free, group, strategy))
            remainder -= group
            progressed = True
        if not progressed:
            return


# --- choosing the nodes ---------------------------------------------------------------------

def _best_plan(numas: Sequence[int], free: Counts, k: int, count: int,
               group: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(members, remainder receivers) of the best-balanced way over k nodes, or None."""
    if math.comb(len(numas), k) * 2 ** k * len(numas) > SEARCH_BUDGET:
        return _direct_plan(numas, free, k, count, group)
    best_balance = math.inf
    best = None
    for combo in combinations(numas, k):
        if best_balance == 0:
            break
        scored = _score_combination(numas, free, combo, count, group)
        if scored is not None and scored[0] < best_balance:
            best_balance, best = scored[0], (combo, scored[1])
    return best


def _score_combination(numas: Sequence[int], free: Counts, combo: tuple[int, ...], count: int,
                       group: int) -> tuple[float, tuple[int, ...]] | None:
    """(balance, remainder subset) of the best way to use ``combo``, or None if it cannot."""
    share = _even_share(free, combo, count, group)
    if share is None:
        return None
    after = dict(free)
    for n in combo:
        after[n] -= share
    remainder = count - share * len(combo)
    if remainder == 0:
        return _balance(after.values()), ()
    candidates = [n for n in combo if after[n] >= group]
    best_balance = math.inf
    best: tuple[int, ...] = ()
    for size in range(len(candidates), 0, -1):
        for subset in combinations(candidates, size):
            if sum(after[n] for n in subset) < remainder:
                continue
            handed = _hand_out(after, subset, remainder, group)
            if handed is None:
                continue
            balance = _balance(handed.values())
            if balance < best_balance:
                best_balance, best = balance, subset
    if best_balance == math.inf:
        return None
    return best_balance, best


def _even_share(free: Counts, combo: Sequence[int], count: int, group: int) -> int | None:
    """The even share per member, or None when the combination cannot hold the request."""
    if sum(free[n] for n in combo) < count:
        return None
    if sum(free[n] // group for n in combo) * group < count:
        return None
    share = count // len(combo) // group * group
    if any(free[n] < share for n in combo):
        return None
    return share


def _hand_out(after: Counts, subset: Sequence[int], remainder: int, group: int) -> Counts | None:
    """Round-robin ``remainder`` over ``subset`` one group at a time; None if groups run out."""
    left = dict(after)
    while remainder > 0:
        progressed = False
        for n in subset:
            if remainder == 0:
                break
            if left[n] < group:
                continue
            left[n] -= group
            remainder -= group
            progressed = True
        if not progressed:
            return None
    return left


def _direct_plan(numas: Sequence[int], free: Counts, k: int, count: int,
                 group: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The same optimum without the search: most-free nodes, remainder to the most left."""
    position = {n: i for i, n in enumerate(numas)}
    ranked = sorted(numas, key=lambda n: (-free[n], position[n]))
    combo = tuple(sorted(ranked[:k], key=position.__getitem__))
    share = _even_share(free, combo, count, group)
    if share is None:
        return None
    remainder = count - share * k
    if remainder == 0:
        return combo, ()
    left = {n: free[n] - share for n in combo}
    receivers = sorted((n for n in combo if left[n] >= group),
                       key=lambda n: (-left[n], position[n]))[:remainder // group]
    subset = tuple(sorted(receivers, key=position.__getitem__))
    if _hand_out(left, subset, remainder, group) is None:
        return None
    return combo, subset


# --- the balance score ------------------------------------------------------------------------

def _go_round3(x: float) -> float:
    """Go's math.Round(x*1000)/1000 for x >= 0 (halves away from zero, unlike Python's round)."""
    scaled = x * 1000
    whole = math.floor(scaled)
    return (whole + 1 if scaled - whole >= 0.5 else whole) / 1000


def _balance(values: Iterable[int]) -> float:
    """Population standard deviation, mean and result rounded to 3 decimals as in the kubelet.

    Summed in ascending order so equal multisets score equal; the kubelet sums in Go map order.
    """
    xs = sorted(values)
    mean = _go_round3(sum(xs) / len(xs))
    variance = sum((x - mean) * (x - mean) for x in xs) / len(xs)
    return _go_round3(math.sqrt(variance))
