"""Which GPUs to give a container: the set with the best link score, chosen as NVIDIA does.

Facts taken from NVIDIA/go-gpuallocator's best-effort policy (our own code):

* A pair of GPUs scores 100 per NVLink between them plus a PCIe score from NVML's common-ancestor
  level: same board 60, one PCIe switch 50, several switches 40, host bridge 30, same NUMA node
  20, across sockets 10. So any NVLink outranks every PCIe relationship, and more links outrank
  fewer. A set scores the sum over its pairs.
* The chosen set is not simply the best-scoring one. The available GPUs are divided into groups of
  the requested size (one smaller group takes what does not divide evenly), the division with the
  highest total score wins, and the best group of that division that holds the must-include GPUs
  is returned. Taking a set therefore never strands GPUs that pair well with each other.

Where we differ, on purpose:

* NVIDIA's allocator does not count NVLinks that end on an NVSwitch (a TODO upstream), which
  reduces NVSwitch machines to PCIe scoring. Here two GPUs that both reach the switch fabric get
  ``min(their NVSwitch links)`` links; on a DGX H100 every pair then has 18, and the PCIe level
  (same NUMA node before across sockets) decides.
* Ties: upstream keeps the first division its enumeration meets. We keep, in order, the highest
  division total, the highest set score, the smallest score towards the GPUs left behind (so a
  1-GPU request takes the GPU whose partners are gone rather than break up a linked pair), and
  finally the lowest PCI addresses. Upstream can also return the smaller leftover group padded
  with nils; only full groups are candidates here.

Bounded work: up to ``EXACT_MAX_GPUS`` (8) GPUs the search is exact: every candidate set, with the
best division of each remainder memoised on its bitmask (at most 2**8 remainders). Above that,
a greedy division seeded from each GPU in turn, improved by swapping GPUs between groups and
then by exact re-divisions of the candidate group with each other group, stands in
(polynomial; bench/bench_devices.py times both, bench/README.md has the figures). It
gives the exact answer on every case of at most 8 GPUs in the tests, and on all but 2 of 1500
random score matrices; ``GpuSelection.exact`` says which search ran. Asking for one GPU, or for
all but at most one, leaves nothing to divide and stays exact at any size.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import combinations

from nri_numa.engine.bitmask import bits
from nri_numa.engine.devices import Chooser, sorted_ids
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Gpu, pcie_level

NVLINK_SCORE = 100  # per NVLink between the two GPUs
PCIE_SCORES = {"internal": 60, "single": 50, "multiple": 40, "hostbridge": 30, "node": 20,
               "system": 10}
EXACT_MAX_GPUS = 8  # above this the exact search outgrows its time budget
_MAX_SWAP_ROUNDS = 1000  # far above what the local search needs; only a guard against cycling


class GpuSelectionError(ValueError):
    """A selection that cannot be made; the message names what was asked and what was there."""


@dataclass(frozen=True, slots=True)
class GpuSelection:
    chosen: tuple[str, ...]  # PCI addresses, ascending
    set_score: int  # sum of pair scores inside the chosen set
    division_score: int  # total of the division the set was taken from (see module doc)
    exact: bool  # False when the swap search stood in for the exact one


def gpu_pcie_level(a: Gpu, b: Gpu, topology: Topology | None = None) -> str:
    """NVML's level between two GPUs; falls back to the PCI tree, then to the NUMA node."""
    level = a.pcie.get(b.pci_address) or b.pcie.get(a.pci_address)
    if level:
        return level
    if topology is not None:
        pa, pb = topology.pci(a.pci_address), topology.pci(b.pci_address)
        if pa is not None and pb is not None:
            return pcie_level(pa, pb)
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return "node"
    return "system"


def nvlink_count(a: Gpu, b: Gpu) -> int:
    """Direct NVLinks between two GPUs plus the links both have into an NVSwitch fabric."""
    ab, ba = a.nvlink_peers.get(b.pci_address, 0), b.nvlink_peers.get(a.pci_address, 0)
    # A link has two ends; when only one GPU reports it, trust the one that does.
    direct = min(ab, ba) if ab and ba else max(ab, ba)
    return direct + min(a.nvswitch_links, b.nvswitch_links)


def pair_score(a: Gpu, b: Gpu, topology: Topology | None = None) -> int:
    if a.pci_address == b.pci_address:
        return 0
    return NVLINK_SCORE * nvlink_count(a, b) + PCIE_SCORES[gpu_pcie_level(a, b, topology)]


def select_gpus(available: Sequence[Gpu], size: int, must_include: Collection[str] = (),
                topology: Topology | None = None) -> GpuSelection:
    """The best ``size`` GPUs of ``available`` that contain every PCI address in ``must_include``.

    ``topology`` (optional) supplies the PCI tree where a GPU lacks NVML's level for a peer.
    """
    gpus = sorted(available, key=lambda g: g.pci_address)
    addresses = [g.pci_address for g in gpus]
    _check_request(addresses, size, must_include)
    if size == 0:
        return GpuSelection((), 0, 0, True)
    scores = [[pair_score(a, b, topology) for b in gpus] for a in gpus]
    required = frozenset(addresses.index(a) for a in must_include)
    choice = best_choice(scores, size, required)
    return GpuSelection(tuple(addresses[i] for i in choice.members), choice.set_score,
                        choice.division_score, choice.exact)


def gpu_chooser(topology: Topology) -> Chooser:
    """A chooser for a GPU resource whose device ids are GPU UUIDs or PCI addresses.

    Ids the topology does not know as GPUs (MIG devices, say) are not scored: must-include ones
    are kept, and the others only fill what the known GPUs cannot, lowest id first.
    """
    by_id: dict[str, Gpu] = {}
    for gpu in topology.gpus:
        by_id[gpu.uuid] = by_id[gpu.pci_address] = gpu

    def choose(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        gpu_of = {i: _lookup(by_id, i) for i in {*available, *must_include}}
        known: dict[str, str] = {}  # PCI address -> the id naming that GPU (first one wins)
        for i in [*must_include, *sorted_ids(available)]:
            if gpu_of[i] is not None:
                known.setdefault(gpu_of[i].pci_address, i)
        must_known = [g.pci_address for g in map(gpu_of.get, must_include) if g is not None]
        must_other = [i for i in must_include if gpu_of[i] is None]
        wanted = min(max(size - len(must_other), len(must_known)), len(known))
        chosen = select_gpus([by_id[a] for a in known], wanted, must_known, topology).chosen
        picked = [*must_other, *(known[a] for a in chosen)]
        rest = sorted_ids(i for i in available if gpu_of[i] is None and i not in picked)
        return [*picked, *rest[:max(0, size - len(picked))]]

    return choose


def _lookup(by_id: dict[str, Gpu], device_id: str) -> Gpu | None:
    return by_id.get(device_id) or by_id.get(device_id.lower())


def _check_request(addresses: list[str], size: int, must_include: Collection[str]) -> None:
    if len(set(addresses)) != len(addresses):
        raise GpuSelectionError(f"GPU PCI addresses repeat among the available GPUs: {addresses}")
    if size < 0:
        raise GpuSelectionError(f"cannot select {size} GPUs")
    if size > len(addresses):
        raise GpuSelectionError(f"asked for {size} GPUs but only {len(addresses)} are available")
    missing = sorted(set(must_include) - set(addresses))
    if missing:
        raise GpuSelectionError(f"must-include GPUs {missing} are not among the available GPUs")
    if len(set(must_include)) > size:
        raise GpuSelectionError(
            f"{len(set(must_include))} GPUs must be included but only {size} were asked for")


@dataclass(frozen=True, slots=True)
class Choice:
    """A chosen set as positions into a score matrix (see ``best_choice``)."""

    members: tuple[int, ...]  # ascending
    set_score: int
    division_score: int
    exact: bool


def best_choice(scores: Sequence[Sequence[int]], size: int, required: frozenset[int]) -> Choice:
    """The set to take: exact search up to ``EXACT_MAX_GPUS`` GPUs, the swap search above.

    One GPU, or all GPUs but at most one, leave nothing to divide, so those stay exact (and
    cheap) at any size. ``scores`` is a symmetric matrix of pair scores (zero diagonal); ties go
    to the lowest positions, so callers order the GPUs the way they want ties broken.
    """
    n = len(scores)
    if n <= EXACT_MAX_GPUS or size == 1 or size >= n - 1:
        return exact_choice(scores, size, required)
    return swap_choice(scores, size, required)


def set_score(scores: Sequence[Sequence[int]], members: Sequence[int]) -> int:
    return sum(scores[a][b] for i, a in enumerate(members) for b in members[i + 1:])


def cut_score(scores: Sequence[Sequence[int]], members: Collection[int]) -> int:
    """Score from the set towards every GPU outside it: what taking the set breaks up."""
    return sum(scores[a][b] for a in members for b in range(len(scores)) if b not in members)


def _tie_key(scores: Sequence[Sequence[int]], members: Sequence[int]) -> tuple:
    """Larger is better: higher set score, then smaller cut, then lower positions."""
    return set_score(scores, members), -cut_score(scores, members), [-m for m in members]


def exact_choice(scores: Sequence[Sequence[int]], size: int, required: frozenset[int]) -> Choice:
    """The best set by exhaustive search with the divisions of each remainder memoised.

    Exponential in the number of GPUs: at 8 GPUs it visits at most 2**8 remainders.
    """
    n = len(scores)
    divisions = _Divisions(scores, size, leftover=n % size)
    everyone = (1 << n) - 1
    must = sum(1 << m for m in required)
    free_bits = [1 << i for i in range(n) if i not in required]
    best: tuple | None = None
    for extra in combinations(free_bits, size - len(required)):
        chosen = must + sum(extra)
        score = divisions.group_score(chosen)
        total = score + divisions.best(everyone ^ chosen)
        if best is not None and (total, score) < best[0][:2]:
            continue  # the tie key is only worth computing for contenders
        members = bits(chosen)
        key = (total, *_tie_key(scores, members))
        if best is None or key > best[0]:
            best = (key, members)
    assert best is not None  # size <= number of GPUs, so some set exists
    (total, score, *_), members = best
    return Choice(tuple(members), score, total, True)


class _Divisions:
    """Best division of a remainder into full groups and one leftover; sets are bitmasks."""

    def __init__(self, scores: Sequence[Sequence[int]], size: int, leftover: int):
        self.scores = scores
        self.size = size
        self.leftover = leftover  # what does not divide evenly forms one smaller group
        self.memo: dict[int, int] = {0: 0}
        self.group_scores: dict[int, int] = {}

    def group_score(self, group: int) -> int:
        score = self.group_scores.get(group)
        if score is None:
            score = self.group_scores[group] = set_score(self.scores, bits(group))
        return score

    def best(self, rest: int) -> int:
        cached = self.memo.get(rest)
        if cached is not None:
            return cached
        first = rest & -rest
        others = [1 << i for i in bits(rest ^ first)]
        remaining = len(others) + 1
        if self.leftover and remaining % self.size == self.leftover:
            sizes = [self.leftover] if remaining == self.leftover else [self.size, self.leftover]
        else:
            sizes = [self.size]
        best = -1
        # Exactly one group of any division holds the lowest GPU: try each such group.
        for group_size in sizes:
            for more in combinations(others, group_size - 1):
                group = first + sum(more)
                value = self.group_score(group) + self.best(rest ^ group)
                if value > best:
                    best = value
        self.memo[rest] = best
        return best


def swap_choice(scores: Sequence[Sequence[int]], size: int, required: frozenset[int]) -> Choice:
    """The best set by a greedy division improved by local moves (polynomial).

    Each free GPU in turn seeds the first group ("group 0", with the must-include GPUs); the rest
    is divided greedily and improved by swapping two GPUs between groups. The best of these
    divisions is then improved further, alternating exact re-divisions of group 0 with each
    other group and swaps, until neither helps. Its best full group holding the must-include
    GPUs wins.
    """
    n = len(scores)
    free = [i for i in range(n) if i not in required]
    extra = [[i] for i in free] if len(required) < size else [[]]
    divisions = []
    for more in extra:
        groups = _greedy_division(scores, size, sorted(required) + more)
        _improve_by_swaps(scores, groups, required)
        divisions.append((_division_key(scores, groups, size, required), groups))
    _, groups = max(divisions, key=lambda d: d[0])
    for _ in range(_MAX_SWAP_ROUNDS):
        if not _improve_by_redividing(scores, groups, required):
            break
        _improve_by_swaps(scores, groups, required)
    total, *_, negated = _division_key(scores, groups, size, required)
    members = [-m for m in negated]
    return Choice(tuple(members), set_score(scores, members), total, False)


def _division_key(scores: Sequence[Sequence[int]], groups: list[list[int]], size: int,
                  required: frozenset[int]) -> tuple:
    """(division total, tie key of its best full group holding the must-include GPUs)."""
    total = sum(set_score(scores, g) for g in groups)
    return max((total, *_tie_key(scores, sorted(g))) for g in groups
               if len(g) == size and required <= set(g))


def _greedy_division(scores: Sequence[Sequence[int]], size: int,
                     seed: list[int]) -> list[list[int]]:
    """Group 0 grown from ``seed``, then each next group from the best free pair; every group
    grows by the GPU that adds most to it, and the leftover group comes last."""
    n = len(scores)
    free = [i for i in range(n) if i not in seed]
    sizes = [size] * (n // size) + ([n % size] if n % size else [])
    groups: list[list[int]] = []
    for index, group_size in enumerate(sizes):
        group = list(seed) if index == 0 else _best_pair(scores, free, group_size)
        free = [i for i in free if i not in group]
        while len(group) < group_size:
            pick = max(free, key=lambda x: (sum(scores[x][m] for m in group), -x))
            free.remove(pick)
            group.append(pick)
        groups.append(group)
    return groups


def _best_pair(scores: Sequence[Sequence[int]], free: list[int], group_size: int) -> list[int]:
    """The two free GPUs that score highest together (lowest positions on ties)."""
    if group_size == 1:
        return free[:1]
    return list(max(combinations(free, 2), key=lambda p: (scores[p[0]][p[1]], -p[0], -p[1])))


def _improve_by_redividing(scores: Sequence[Sequence[int]], groups: list[list[int]],
                           required: frozenset[int]) -> bool:
    """Divide group 0 and another group anew, exactly, where together they have at most
    ``EXACT_MAX_GPUS`` GPUs; this reaches what single swaps cannot (two GPUs moving at once).

    A change must raise the two groups' total, or keep it and raise group 0; group 0 keeps the
    must-include GPUs. Returns whether any group changed.
    """
    changed = False
    for other in range(1, len(groups)):
        union = sorted(groups[0] + groups[other])
        if len(union) > EXACT_MAX_GPUS:
            continue
        sub = [[scores[x][y] for y in union] for x in union]
        # group 0 is full; the other may be the smaller leftover group, as exact_choice expects
        choice = exact_choice(sub, len(groups[0]), frozenset(union.index(m) for m in required))
        kept = set_score(scores, groups[0])
        if (choice.division_score, choice.set_score) > (
                kept + set_score(scores, groups[other]), kept):
            groups[0] = [union[i] for i in choice.members]
            groups[other] = [x for x in union if x not in groups[0]]
            changed = True
    return changed


def _improve_by_swaps(scores: Sequence[Sequence[int]], groups: list[list[int]],
                      fixed: frozenset[int]) -> None:
    """Swap GPUs between groups while the division total rises, or stays and group 0 gains.

    Group 0 is the candidate set (seeded, with the must-include GPUs): among divisions of equal
    total, one where it scores higher is preferred, as the exact search prefers.
    """
    n = len(scores)
    where = {m: gi for gi, g in enumerate(groups) for m in g}
    towards = [[sum(scores[m][x] for x in g) for g in groups] for m in range(n)]
    for _ in range(_MAX_SWAP_ROUNDS):
        best_gain, best_pair = (0, 0), None
        for a in range(n):
            if a in fixed:
                continue
            ga, row_a = where[a], towards[a]
            for b in range(a + 1, n):
                gb = where[b]
                if gb == ga or b in fixed:
                    continue
                ab, row_b = scores[a][b], towards[b]
                gain = row_a[gb] - row_a[ga] + row_b[ga] - row_b[gb] - 2 * ab
                if ga == 0:
                    target = row_b[0] - ab - row_a[0]
                elif gb == 0:
                    target = row_a[0] - ab - row_b[0]
                else:
                    target = 0
                if (gain, target) > best_gain:
                    best_gain, best_pair = (gain, target), (a, b)
        if best_pair is None:
            return
        a, b = best_pair
        ga, gb = where[a], where[b]
        groups[ga][groups[ga].index(a)] = b
        groups[gb][groups[gb].index(b)] = a
        where[a], where[b] = gb, ga
        for m in range(n):
            towards[m][ga] += scores[m][b] - scores[m][a]
            towards[m][gb] += scores[m][a] - scores[m][b]
